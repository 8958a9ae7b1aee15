package daemon

import (
	"context"
	"errors"
	"fmt"
	"github.com/fencesandbox/fence/internal/capacity"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"slices"

	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/template"
)

// backendStack builds what the sandbox manager creates on, over routed
// (the daemon's backend or its router of backends) and layers: on a
// cluster node (opts.Cluster) a naming wrapper whose sandbox IDs carry the
// node's tag, for the routers (forks and sandboxes made from snapshots
// included); in front, one warm pool per --warm-template, each in front of
// the next, and the default template's pool in front of them all, so that
// a create is served by the pool that keeps its kind, or goes through to
// the backend. Every capability of routed is the stack's (isolation.As).
// The caller closes the pools, pool first.
func backendStack(routed isolation.Backend, layers isolation.Layers, opts Config, log *slog.Logger) (pool *warm.Pool, tmplPools []*warm.Pool, _ isolation.Layers) {
	inner := routed
	if opts.Cluster != nil {
		tag := cluster.Tag(opts.Cluster.Name)
		inner = cluster.NamingBackend(routed, tag)
		if layers != nil {
			layers = cluster.NamingLayers(layers, tag)
		}
	}
	for _, wt := range slices.Backward(opts.WarmTemplates) {
		p := warm.New(warm.Options{Backend: inner, Size: wt.Size, Logger: log})
		tmplPools = append([]*warm.Pool{p}, tmplPools...)
		inner = p
	}
	pool = warm.New(warm.Options{Backend: inner, Size: opts.WarmPool, Logger: log})
	return pool, tmplPools, layers
}

// ClusterOptions make the daemon a node of a fence cluster (see
// internal/cluster): it registers in a Lease, names its sandboxes with its
// tag, and answers only requests carrying Token.
type ClusterOptions struct {
	// Kubeconfig is the kubeconfig file; empty means in-cluster.
	Kubeconfig string
	Namespace  string // required
	Name       string // the node's name; required (cluster.ValidName)
	// URL is where routers reach this node; empty means http(s)://ADDR of
	// the listener (which must then not be a wildcard address).
	URL   string
	Token string // required
}

func (c *ClusterOptions) validate() error {
	if c.Namespace == "" || c.Token == "" {
		return errors.New("cluster: a namespace and the cluster token (FENCE_CLUSTER_TOKEN) are required")
	}
	return cluster.ValidName(c.Name)
}

// advertised returns the URL routers reach the node at.
func (c *ClusterOptions) advertised(scheme string, addr net.Addr) (string, error) {
	if c.URL != "" {
		return c.URL, nil
	}
	ta, ok := addr.(*net.TCPAddr)
	if !ok || ta.IP.IsUnspecified() {
		return "", fmt.Errorf("cluster: listening on %s: give the URL routers reach this node at (--cluster-advertise)", addr)
	}
	return scheme + "://" + addr.String(), nil
}

// joinCluster registers the node and keeps its Lease renewed until ctx is
// done.
func joinCluster(ctx context.Context, c *ClusterOptions, url string, mgr *sandbox.Manager, capacity int,
	templates *template.Store, log *slog.Logger) (*cluster.Registrar, error) {
	kube, err := cluster.NewClient(c.Kubeconfig, "fence-node/"+c.Name)
	if err != nil {
		return nil, err
	}
	reg, err := cluster.Register(ctx, cluster.RegistrarOptions{
		Client: kube, Namespace: c.Namespace, Name: c.Name, URL: url, Version: version(), Logger: log,
		Load: func() (int, int, []string) {
			n, paused := mgr.Counts()
			running := n + paused
			st, ok := mgr.Capacity()
			return leaseCapacity(capacity, running, st, ok), running, builtTemplates(templates)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("joining the cluster: %w", err)
	}
	go reg.Run(ctx)
	return reg, nil
}

// leaseCapacity is the capacity a node advertises: its cap (max), or
// fewer when the host's limits hold fewer more sandboxes than the cap
// leaves (st, when known).
func leaseCapacity(max, running int, st capacity.Status, known bool) int {
	if known && int64(running)+st.Sandboxes < int64(max) {
		return running + int(st.Sandboxes)
	}
	return max
}

// builtTemplates lists the templates the node can start sandboxes from.
func builtTemplates(s *template.Store) []string {
	names := s.Names()
	if ents, err := os.ReadDir(s.Dir()); err == nil {
		for _, e := range ents {
			if e.IsDir() && !slices.Contains(names, e.Name()) && template.ValidateName(e.Name()) == nil {
				names = append(names, e.Name())
			}
		}
	}
	var out []string
	for _, n := range names {
		if _, err := s.Resolve(n); err == nil {
			out = append(out, n)
		}
	}
	return out
}

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "devel"
}
