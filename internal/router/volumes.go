package router

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
)

// Volumes through the router. A volume lives on the node that made it,
// and its ID is a UUID (the SDK's and the daemon's contract), so unlike a
// sandbox's ID it cannot carry its node's tag. The router keeps no record
// of volumes either: the owner of a volume is found by asking the nodes
// (each answers only for its own volumes, and only for the caller's team:
// the caller's key is what the nodes see). This holds with SharedRecords
// too, as a volume's record is kept in its node's own database.
//
//   - POST /volumes is placed like a create (any placeable node), after
//     every live node has been asked whether the team uses the name
//     already: names stay unique per team across the cluster.
//   - GET /volumes merges the lists of every live node.
//   - /volumes/{id} goes to the node whose list holds id.
//   - /volumecontent/{id}/… (a volume token, not an API key) goes to the
//     node that accepts the token: each token is an HMAC under its node's
//     own key, so every other node refuses it with 401. The owner found
//     is probed again on every call (a GET of the volume's root, which
//     changes nothing); the request's body is sent to that node only.
//   - A create with volumeMounts goes to the node holding the named
//     volumes; volumes of two nodes in one create are a 400.

// volumeIDOf is the {volumeID} of /volumes/{volumeID}[/…], or "".
func volumeIDOf(p string) string {
	rest, ok := strings.CutPrefix(p, "/volumes/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// teamVolumes lists the team's volumes on every live node, by node. A
// node's error answer (a bad key, volumes not enabled) is returned as is
// in failed, when no node answered 200.
func (rt *Router) teamVolumes(r *http.Request) (byNode map[string][]api.Volume, nodes map[string]cluster.Node, failed *nodeAnswer) {
	q := r.Clone(r.Context())
	q.URL = &url.URL{Path: "/volumes"}
	byNode, nodes = map[string][]api.Volume{}, map[string]cluster.Node{}
	for _, a := range rt.fanOut(q) {
		if a.err != nil {
			rt.log.Warn("volumes: node did not answer", "node", a.node.Name, "err", a.err)
			continue
		}
		if a.status != http.StatusOK {
			if failed == nil {
				failed = &a
			}
			continue
		}
		var vs []api.Volume
		if err := json.Unmarshal(a.body, &vs); err != nil {
			rt.log.Warn("volumes: bad answer from node", "node", a.node.Name, "err", err)
			continue
		}
		byNode[a.node.Name], nodes[a.node.Name] = vs, a.node
	}
	if len(nodes) > 0 {
		failed = nil
	}
	return byNode, nodes, failed
}

func writeAnswer(w http.ResponseWriter, a *nodeAnswer) {
	copyHeader(w.Header(), a.header)
	w.Header().Del("Content-Length")
	w.WriteHeader(a.status)
	w.Write(a.body)
}

// serveVolumes serves the control-plane routes of volumes (/volumes…).
func (rt *Router) serveVolumes(w http.ResponseWriter, r *http.Request) {
	byNode, nodes, failed := rt.teamVolumes(r)
	if failed != nil {
		writeAnswer(w, failed)
		return
	}
	switch id := volumeIDOf(r.URL.Path); {
	case r.URL.Path == "/volumes" && r.Method == http.MethodGet:
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range byNode {
				if !yield(n) {
					return
				}
			}
		})
		all := []api.Volume{}
		for _, n := range names {
			all = append(all, byNode[n]...)
		}
		writeJSON(w, http.StatusOK, all)
	case r.URL.Path == "/volumes" && r.Method == http.MethodPost:
		rt.createVolume(w, r, byNode)
	case id != "":
		for name, vs := range byNode {
			if slices.ContainsFunc(vs, func(v api.Volume) bool { return v.VolumeID == id }) {
				rt.forward(w, r, &route{node: nodes[name]})
				return
			}
		}
		rt.forwardAny(w, r) // a bad or unknown ID: any node answers it alike
	default:
		rt.forwardAny(w, r)
	}
}

// createVolume places POST /volumes on a node, unless the team has a
// volume of that name on any node already.
func (rt *Router) createVolume(w http.ResponseWriter, r *http.Request, byNode map[string][]api.Volume) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeErr(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return
	}
	var req api.NewVolume
	if json.Unmarshal(body, &req) == nil && req.Name != "" {
		for _, vs := range byNode {
			if slices.ContainsFunc(vs, func(v api.Volume) bool { return v.Name == req.Name }) {
				// The node's own answer to a name in use.
				writeErr(w, http.StatusBadRequest, "Volume with name '"+req.Name+"' already exists")
				return
			}
		}
	}
	rt.placeBody(w, r, rt.place(""), body)
}

// placeBody sends a create's body to the first of cands that takes it.
func (rt *Router) placeBody(w http.ResponseWriter, r *http.Request, cands []cluster.Node, body []byte) {
	if len(cands) == 0 {
		writeErr(w, http.StatusServiceUnavailable, "no fence node can take a sandbox now (none live and not draining)")
		return
	}
	for i, n := range cands {
		last := i == len(cands)-1 || i == 2
		if rt.tryCreate(w, r, n, body, last) || last {
			return
		}
	}
}

// mountsNode is the node holding the volumes a create mounts, by name:
// ok is false when the answer has been written (volumes on two nodes, a
// node's error); a zero node with ok means no node holds any of them (the
// create is placed as usual, and its node refuses the unknown names).
func (rt *Router) mountsNode(w http.ResponseWriter, r *http.Request, mounts []api.VolumeMount) (cluster.Node, bool) {
	byNode, nodes, failed := rt.teamVolumes(r)
	if failed != nil {
		writeAnswer(w, failed)
		return cluster.Node{}, false
	}
	var owner string
	var ownerVol string
	for _, m := range mounts {
		for name, vs := range byNode {
			if !slices.ContainsFunc(vs, func(v api.Volume) bool { return v.Name == m.Name }) {
				continue
			}
			if owner != "" && owner != name {
				writeErr(w, http.StatusBadRequest, "invalid mounts: volumes '"+ownerVol+"' and '"+m.Name+
					"' are on different nodes of the cluster; a sandbox mounts the volumes of one node only")
				return cluster.Node{}, false
			}
			owner, ownerVol = name, m.Name
		}
	}
	return nodes[owner], true
}

// serveVolumeContent sends /volumecontent/{id}/… to the node that accepts
// its token (see above); when none does, the last refusal is the answer.
func (rt *Router) serveVolumeContent(w http.ResponseWriter, r *http.Request) {
	id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/volumecontent/"), "/")
	var last *nodeAnswer
	for _, n := range rt.nodes.Nodes() {
		u, _ := url.Parse(n.URL)
		u.Path, u.RawQuery = "/volumecontent/"+id+"/path", "path=/"
		probe, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), http.NoBody)
		if err != nil {
			continue
		}
		probe.Header.Set("Authorization", r.Header.Get("Authorization"))
		probe.Header.Set(cluster.HeaderToken, rt.token)
		resp, err := rt.client.Do(probe)
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			rt.forward(w, r, &route{node: n})
			return
		case resp.StatusCode == http.StatusUnauthorized && bytes.Contains(b, []byte("invalid volume token")):
			if last == nil {
				last = &nodeAnswer{node: n, status: resp.StatusCode, header: resp.Header, body: b}
			}
		case last == nil || last.status == http.StatusUnauthorized:
			// The owner's answer (a volume deleted since), or a node
			// without volumes: kept unless a node takes the token.
			last = &nodeAnswer{node: n, status: resp.StatusCode, header: resp.Header, body: b}
		}
	}
	if last == nil {
		writeErr(w, http.StatusServiceUnavailable, "no fence node is live")
		return
	}
	writeAnswer(w, last)
}
