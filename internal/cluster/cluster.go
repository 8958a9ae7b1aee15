// Package cluster lets many `fence serve` nodes stand behind stateless
// `fence router`s, with Kubernetes as the only shared state: each node
// registers itself in a coordination.k8s.io/v1 Lease of one namespace, and
// routers watch those Leases.
//
// # The record
//
// A node's Lease is named fence-node-<name>, labelled
// app.kubernetes.io/component=fence-node, held by <name>, and renewed every
// few seconds (Registrar). Its annotation fence.dev/node holds the node's
// Status as JSON: the URL routers reach it at, its capacity and load, the
// templates it can start and its version. An operator drains a node by
// setting the annotation fence.dev/drain=true on its Lease; the node keeps
// annotations it does not own.
//
// # Sandbox IDs carry their node
//
// A node in a cluster names its sandboxes Tag(name) + 15 random characters
// (still 20 characters of [a-z0-9], E2B's shape), so a router finds the node
// of any sandbox from its ID alone, with no lookup per request (NamingBackend).
//
// # Guarantees
//
//   - A router (Watcher) only ever reads Kubernetes through one watch; it
//     never asks Kubernetes anything on a request's path.
//   - A node whose Lease has not been renewed for its lease duration, as
//     seen by the router's own clock (no clock is compared across hosts),
//     is dead: nothing is placed on it and its sandboxes are reported gone.
//   - A draining node (fence.dev/drain=true, or the node shutting down)
//     gets no new sandbox; its running sandboxes keep being served.
//   - Two nodes whose names give the same tag are refused: Register fails
//     on the second while the first one's Lease is live.
//   - In cluster mode a node answers only requests that carry the cluster
//     token (RequireToken; GET /health excepted), and the token never goes
//     further than the node.
package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
)

const (
	// LabelComponent and NodeComponent label every node Lease.
	LabelComponent = "app.kubernetes.io/component"
	NodeComponent  = "fence-node"
	// AnnotationNode holds the node's Status (JSON), written by the node.
	AnnotationNode = "fence.dev/node"
	// AnnotationDrain, set to "true" by an operator, drains the node.
	AnnotationDrain = "fence.dev/drain"
	// LeasePrefix + node name is the Lease's name.
	LeasePrefix = "fence-node-"
	// HeaderToken carries the cluster token from router to node.
	HeaderToken = "X-Fence-Cluster-Token"
	// TagLen is the length of the node tag at the start of sandbox IDs.
	TagLen = 5
	idLen  = 20
)

// Status is what a node publishes about itself.
type Status struct {
	Name string `json:"name"`
	Tag  string `json:"tag"`
	// URL is where routers reach the node's API (http:// or https://).
	URL string `json:"url"`
	// Capacity is the most sandboxes the node runs at once (its cap, or
	// fewer when its host's limits hold fewer: Running plus the capacity
	// left); Running how many it runs (paused ones included: they hold
	// their memory).
	Capacity int `json:"capacity"`
	Running  int `json:"running"`
	// Templates the node can start sandboxes from.
	Templates []string `json:"templates"`
	Version   string   `json:"version"`
	// Draining is set by the node itself when it shuts down.
	Draining bool `json:"draining,omitempty"`
}

const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// Tag returns the node tag of a node name: TagLen characters of [a-z0-9]
// from its SHA-256.
func Tag(name string) string {
	sum := sha256.Sum256([]byte(name))
	n := new(big.Int).SetBytes(sum[:])
	out := make([]byte, TagLen)
	base := big.NewInt(int64(len(alphabet)))
	mod := new(big.Int)
	for i := range out {
		n.DivMod(n, base, mod)
		out[i] = alphabet[mod.Int64()]
	}
	return string(out)
}

// TagOf returns the node tag of a sandbox ID made by a cluster node.
func TagOf(id string) (string, bool) {
	if len(id) != idLen {
		return "", false
	}
	return id[:TagLen], true
}

// NewID returns a sandbox ID for the node with this tag: the tag and 15
// characters of [a-z0-9] from crypto/rand, each equally likely.
func NewID(tag string) string {
	out := make([]byte, 0, idLen)
	out = append(out, tag...)
	var buf [32]byte
	for len(out) < idLen {
		rand.Read(buf[:])
		for _, b := range buf {
			if b < 252 && len(out) < idLen { // 252 = 7*36: uniform
				out = append(out, alphabet[b%36])
			}
		}
	}
	return string(out)
}

// NamingBackend wraps b so that every sandbox it starts without a name
// gets one from NewID(tag). Sandboxes started ahead of requests (a warm
// pool above it) are named the same way. Every other capability of b
// (isolation.As through Unwrap) is the wrapper's.
func NamingBackend(b isolation.Backend, tag string) isolation.Backend {
	return &namingBackend{Backend: b, tag: tag}
}

type namingBackend struct {
	isolation.Backend
	tag string
}

func (n *namingBackend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	if spec.ID == "" {
		spec.ID = NewID(n.tag)
	}
	return n.Backend.Create(ctx, spec)
}

// Unwrap returns the wrapped backend, whose capabilities (a router's Has,
// an Adopter's Adopt) are found through the wrapper with isolation.As.
func (n *namingBackend) Unwrap() isolation.Backend { return n.Backend }

// NamingLayers wraps l so that every sandbox it boots on a layer without a
// name (a fork, a create from a snapshot) gets one from NewID(tag).
func NamingLayers(l isolation.Layers, tag string) isolation.Layers {
	return &namingLayers{Layers: l, tag: tag}
}

type namingLayers struct {
	isolation.Layers
	tag string
}

func (n *namingLayers) CreateOn(ctx context.Context, spec isolation.Spec, layer string) (isolation.Sandbox, error) {
	if spec.ID == "" {
		spec.ID = NewID(n.tag)
	}
	return n.Layers.CreateOn(ctx, spec, layer)
}

// RequireToken lets through to next only the requests that carry token in
// HeaderToken (compared in constant time), and removes the header before
// next sees it. GET /health passes without it, for liveness probes. An
// empty token lets nothing through.
func RequireToken(token string, next http.Handler) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get(HeaderToken))
		r.Header.Del(HeaderToken)
		health := r.Method == http.MethodGet && r.URL.Path == "/health" && r.Header.Get(api.HeaderSandboxID) == "" &&
			plainHost(r.Host)
		if !health && (len(want) == 0 || subtle.ConstantTimeCompare(got, want) != 1) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			json.NewEncoder(w).Encode(api.Error{Code: http.StatusUnauthorized,
				Message: "this fence node serves only its cluster's routers"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// plainHost reports whether host (with or without a port) is an IP address
// or localhost: never a sandbox's host name.
func plainHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	_, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil || strings.EqualFold(host, "localhost")
}

// LeaseName returns the Lease name of node name.
func LeaseName(name string) string { return LeasePrefix + name }

// ValidName reports whether name can name a node: a DNS label (it becomes
// part of the Lease's name).
func ValidName(name string) error {
	if len(name) == 0 || len(name) > 63-len(LeasePrefix) {
		return fmt.Errorf("node name %q: want 1 to %d characters", name, 63-len(LeasePrefix))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(name)-1
		if !ok {
			return fmt.Errorf("node name %q: want a DNS label ([a-z0-9-], not starting or ending with -)", name)
		}
	}
	return nil
}
