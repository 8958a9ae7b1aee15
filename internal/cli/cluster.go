package cli

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/router"
)

// DefaultClusterNamespace is the namespace of the node Leases.
const DefaultClusterNamespace = "fence"

// clusterFlags are `fence serve`'s --cluster-… flags: they bind to the
// fields of o, which becomes the daemon's Config.Cluster when the node
// joins a cluster (options).
type clusterFlags struct {
	inCluster bool
	o         fencedaemon.ClusterOptions
}

func (c *clusterFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&c.o.Kubeconfig, "cluster-kubeconfig", "", "join a fence cluster through the Kubernetes API with this kubeconfig (the cluster token is $FENCE_CLUSTER_TOKEN)")
	fs.BoolVar(&c.inCluster, "cluster-in-cluster", false, "join a fence cluster with the pod's service account")
	fs.StringVar(&c.o.Namespace, "cluster-namespace", DefaultClusterNamespace, "namespace of the cluster's node Leases")
	fs.StringVar(&c.o.Name, "cluster-node-name", "", "this node's name in the cluster (default $NODE_NAME, else the host name)")
	fs.StringVar(&c.o.URL, "cluster-advertise", "", "URL the routers reach this node at (default: the listen address)")
}

// options returns the cluster options, or nil when not joining.
func (c *clusterFlags) options() (*fencedaemon.ClusterOptions, error) {
	if c.o.Kubeconfig == "" && !c.inCluster {
		return nil, nil
	}
	if c.o.Kubeconfig != "" && c.inCluster {
		return nil, usagef("--cluster-kubeconfig and --cluster-in-cluster exclude each other")
	}
	o := c.o
	if o.Name == "" {
		o.Name = os.Getenv("NODE_NAME")
	}
	if o.Name == "" {
		h, _ := os.Hostname()
		o.Name = strings.ToLower(h)
	}
	o.Token = os.Getenv("FENCE_CLUSTER_TOKEN")
	if o.Token == "" {
		return nil, usagef("joining a cluster needs the cluster token in $FENCE_CLUSTER_TOKEN")
	}
	return &o, nil
}

func routerCmd(deps Deps) *cobra.Command {
	var c router.Config
	var inCluster bool
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Serve the E2B API in front of a cluster of fence nodes",
		Long: `Serve one E2B endpoint in front of many fence nodes (fence serve
--cluster-…), found through their Leases in the Kubernetes API. The router
keeps no state: run as many as you like behind a load balancer.

Clients authenticate with $FENCE_API_KEY (the nodes' key); the router
reaches the nodes with the cluster token $FENCE_CLUSTER_TOKEN. Sizing,
security and upgrades: docs/SCALEOUT.md.`,
		Example: `  FENCE_API_KEY=e2b_… FENCE_CLUSTER_TOKEN=… fence router --kubeconfig ~/.kube/config`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.Router == nil {
				return errUnavailable("fence router")
			}
			if (c.Kubeconfig == "") == !inCluster {
				return usagef("give exactly one of --kubeconfig and --in-cluster")
			}
			if (c.TLSCert == "") != (c.TLSKey == "") {
				return usagef("--tls-cert and --tls-key go together")
			}
			if c.ShutdownDelay < 0 {
				return usagef("--shutdown-delay must not be negative")
			}
			c.APIKey, c.Token = os.Getenv("FENCE_API_KEY"), os.Getenv("FENCE_CLUSTER_TOKEN")
			if c.APIKey == "" || c.Token == "" {
				return usagef("fence router needs $FENCE_API_KEY and $FENCE_CLUSTER_TOKEN")
			}
			return untilSignal(cmd, "routing", func(ctx context.Context) error { return deps.Router(ctx, c) })
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&c.Addr, "addr", DefaultAddr, "listen address (host:port)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file of the Kubernetes API")
	fs.BoolVar(&inCluster, "in-cluster", false, "use the pod's service account")
	fs.StringVar(&c.Namespace, "namespace", DefaultClusterNamespace, "namespace of the node Leases")
	fs.StringVar(&c.Domain, "domain", DefaultDomain, "base domain of sandbox hosts ({port}-{id}.DOMAIN), as on the nodes")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fs.StringVar(&c.NodeCA, "node-ca", "", "PEM bundle trusted for https:// node URLs (default: the host's roots)")
	fs.BoolVar(&c.SharedRecords, "shared-database", false, "the nodes keep their shared records in one database (fence serve --database): serve /secrets through any node instead of 501")
	addRouterRegistryFlag(fs, &c)
	fs.DurationVar(&c.ShutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, keep serving this long with /health answering 503 before closing the listener")
	return cmd
}
