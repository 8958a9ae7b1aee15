package router

import (
	"crypto/sha256"
	"encoding/binary"
	"net/http"
	"strings"

	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/ui"
)

// Template builds through the router. A build is one node's from its
// registration to its end: the node keeps its record, its uploaded files
// and its logs, and, with a content registry, pushes the template for the
// others to pull once it is ready.
//
// Guarantees:
//   - The routes of one build (register, the files' upload links, trigger,
//     status and logs) go to one node: the live, placeable node that ranks
//     first for the caller's credential by rendezvous hashing (its
//     X-API-Key, else its Authorization). Every router ranks the same
//     nodes alike, so a client's calls meet one node through any router,
//     and the builds of different keys spread over the nodes.
//   - An upload link carries no credential: its token starts with the tag
//     of the node that gave it (fence serve in a cluster), and the router
//     sends it there. An unknown or dead node's link answers 404.
//   - A node that joins, leaves or is drained while a build runs may
//     change the rank: later calls of that build then reach a node that
//     does not know it and answer 404. The build itself goes on where it
//     started.

// uploadPrefix is where the nodes' upload links point.
const uploadPrefix = "/_fence/template-files/"

// isBuildRoute reports whether r is one of a template build's routes.
func isBuildRoute(r *http.Request) bool {
	p := r.URL.Path
	if r.Method == http.MethodPost && (p == "/v3/templates" || p == "/v2/templates" || p == "/templates") {
		return true
	}
	rest, ok := strings.CutPrefix(strings.TrimPrefix(p, "/v2"), "/templates/")
	if !ok {
		return false
	}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 3 && parts[1] == "files":
		return r.Method == http.MethodGet
	case len(parts) == 3 && parts[1] == "builds":
		return r.Method == http.MethodPost
	case len(parts) >= 4 && parts[1] == "builds":
		sub := strings.Join(parts[3:], "/")
		return r.Method == http.MethodGet && (sub == "status" || sub == "logs" || sub == "logs/stream")
	}
	return false
}

// buildNode is the node of the caller's builds.
func (rt *Router) buildNode(r *http.Request) (cluster.Node, bool) {
	cred := r.Header.Get("X-API-Key")
	if cred == "" {
		cred = r.Header.Get("Authorization")
	}
	var best cluster.Node
	var bestScore uint64
	found := false
	for _, n := range rt.nodes.Nodes() {
		if !n.Placeable() {
			continue
		}
		sum := sha256.Sum256([]byte(cred + "\x00" + n.Name))
		if s := binary.BigEndian.Uint64(sum[:8]); !found || s > bestScore || s == bestScore && n.Name < best.Name {
			best, bestScore, found = n, s, true
		}
	}
	return best, found
}

// serveBuild sends a build's route to the caller's build node.
func (rt *Router) serveBuild(w http.ResponseWriter, r *http.Request) {
	n, ok := rt.buildNode(r)
	if !ok {
		writeErr(w, http.StatusServiceUnavailable, "no fence node takes template builds (none is live and not drained)")
		return
	}
	rt.forward(w, r, &route{node: n})
}

// serveUpload sends an upload link to the node that gave it.
func (rt *Router) serveUpload(w http.ResponseWriter, r *http.Request) {
	ui.StripSession(r.Header)
	token := strings.TrimPrefix(r.URL.Path, uploadPrefix)
	var n cluster.Node
	ok := len(token) > cluster.TagLen
	if ok {
		n, ok = rt.nodes.Node(token[:cluster.TagLen])
	}
	if !ok {
		writeErr(w, http.StatusNotFound, "upload link not found")
		return
	}
	rt.forward(w, r, &route{node: n})
}
