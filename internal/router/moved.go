package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
)

// Sandboxes moved off a drained node (fence serve --drain-moves, nodes on
// one database and registry): a moved sandbox keeps its ID, whose tag
// names the node it left. When that node is drained or dead, the router
// asks a live node where the sandbox is (GET /moved-sandboxes/{id},
// answered from the shared database, for the client's team) and sends
// the request there; a connect or resume of a sandbox still waiting in
// the registry goes to a placeable node, which takes it over. The router
// keeps nothing of it: the next request asks again. Sandboxes of a live,
// undrained node, and every request when the nodes share no database,
// cost nothing more.

// locateTimeout bounds the router's question to a node.
const locateTimeout = 10 * time.Second

// movedNode returns the node to send a request for sandbox id to when its
// tag's node is drained or dead and the sandbox moved: ok is false when
// the usual routing by tag applies. resume tells that the request is a
// connect or resume, which a sandbox waiting in the registry is placed
// for.
func (rt *Router) movedNode(r *http.Request, id string, resume bool) (cluster.Node, bool) {
	if !rt.teamKeys {
		return cluster.Node{}, false
	}
	if n, live := rt.nodeOf(id); live && !n.Drained && !n.Draining {
		return cluster.Node{}, false
	}
	loc, ok := rt.locate(r, id)
	if !ok {
		return cluster.Node{}, false
	}
	if loc.Node != "" {
		for _, n := range rt.nodes.Nodes() {
			if n.Name == loc.Node {
				return n, true
			}
		}
		return cluster.Node{}, false
	}
	if !resume {
		return cluster.Node{}, false
	}
	if nodes := rt.place(""); len(nodes) > 0 {
		return nodes[0], true
	}
	return cluster.Node{}, false
}

// locate asks a live node (a placeable one first) where moved sandbox id
// is, with the client's credentials.
func (rt *Router) locate(r *http.Request, id string) (api.SandboxLocation, bool) {
	nodes := rt.place("")
	if len(nodes) == 0 {
		nodes = rt.nodes.Nodes()
	}
	if len(nodes) == 0 {
		return api.SandboxLocation{}, false
	}
	n := nodes[0]
	ctx, cancel := context.WithTimeout(r.Context(), locateTimeout)
	defer cancel()
	u, _ := url.Parse(n.URL)
	u.Path = "/moved-sandboxes/" + id
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return api.SandboxLocation{}, false
	}
	for _, h := range []string{"X-API-Key", "Authorization"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	if req.Header.Get("X-API-Key") == "" && req.Header.Get("Authorization") == "" {
		// Sandbox traffic carries no API key: the router's own asks.
		req.Header.Set("X-API-Key", string(rt.apiKey))
	}
	req.Header.Set(cluster.HeaderToken, rt.token)
	resp, err := rt.client.Do(req)
	if err != nil {
		rt.log.Warn("locating a moved sandbox: node did not answer", "node", n.Name, "sandbox_id", id, "err", err)
		return api.SandboxLocation{}, false
	}
	defer resp.Body.Close()
	var loc api.SandboxLocation
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode != http.StatusNotFound {
			rt.log.Warn("locating a moved sandbox", "node", n.Name, "sandbox_id", id, "status", resp.StatusCode)
		}
		return api.SandboxLocation{}, false
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&loc) != nil || loc.SandboxID != id {
		return api.SandboxLocation{}, false
	}
	return loc, true
}
