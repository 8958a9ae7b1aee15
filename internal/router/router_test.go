package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/mcp"
	"github.com/fencesandbox/fence/internal/testutil"
)

type fakeNodes map[string]cluster.Node // by tag

func (f fakeNodes) Node(tag string) (cluster.Node, bool) { n, ok := f[tag]; return n, ok }
func (f fakeNodes) Nodes() []cluster.Node {
	var out []cluster.Node
	for _, n := range f {
		out = append(out, n)
	}
	return out
}

func node(name, url string, capacity, running int, templates ...string) cluster.Node {
	return cluster.Node{Status: cluster.Status{Name: name, Tag: cluster.Tag(name), URL: url, Capacity: capacity,
		Running: running, Templates: templates}, Expires: time.Now().Add(time.Hour)}
}

func TestPlace(t *testing.T) {
	drained := node("d", "http://d", 100, 0, "base")
	drained.Drained = true
	nodes := fakeNodes{}
	for _, n := range []cluster.Node{node("a", "http://a", 10, 9, "base"), node("b", "http://b", 10, 2, "base"),
		node("c", "http://c", 100, 0, "minimal"), drained} {
		nodes[n.Tag] = n
	}
	rt := New(Options{Nodes: nodes, K: 3})
	for range 50 {
		got := rt.place("base")
		if got[0].Name != "b" {
			t.Fatalf("best of 3 with base: %s, want b (most free with the template)", got[0].Name)
		}
		for _, n := range got {
			if n.Name == "d" || n.Name == "c" {
				t.Fatalf("candidates include %s (drained, or without the template)", n.Name)
			}
		}
	}
	if got := rt.place("unknown"); len(got) != 3 || got[0].Name != "c" {
		t.Errorf("a template no node has goes to the freest placeable node: %v", got)
	}

	// Nodes that pull templates from one registry: those with it first,
	// then the others (by free capacity), never the drained one.
	for _, o := range []Options{{SharedRecords: true}, {SharedContent: true}} {
		o.Nodes, o.K = nodes, 3
		if got := New(o).place("base"); len(got) != 2 {
			t.Errorf("%+v: candidates %v, want a and b alone (no shared registry and database)", o, got)
		}
	}
	rt = New(Options{Nodes: nodes, K: 3, SharedRecords: true, SharedContent: true})
	for range 50 {
		got := rt.place("base")
		var names []string
		for _, n := range got {
			names = append(names, n.Name)
		}
		if strings.Join(names, ",") != "b,a,c" {
			t.Fatalf("with a shared registry: candidates %v, want b, a (with base) then c", names)
		}
	}
}

func TestRoutesByTagAndGoneNodes(t *testing.T) {
	var sawToken, sawHost string
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawToken, sawHost = r.Header.Get(cluster.HeaderToken), r.Host
		w.WriteHeader(299)
		io.WriteString(w, "from live")
	}))
	defer live.Close()
	nodes := fakeNodes{}
	nodes[cluster.Tag("live")] = node("live", live.URL, 10, 0)
	rt := New(Options{Nodes: nodes, APIKey: "key", Token: "tok", Domain: "example.test"})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	do := func(method, path string, hdr map[string]string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	onLive := cluster.NewID(cluster.Tag("live"))
	onDead := cluster.NewID(cluster.Tag("dead"))

	if st, _ := do("GET", "/sandboxes/"+onLive, map[string]string{cluster.HeaderToken: "tok"}); st != 401 {
		t.Errorf("no API key: %d", st)
	}
	if st, b := do("GET", "/sandboxes/"+onLive, map[string]string{"X-API-Key": "key", cluster.HeaderToken: "forged"}); st != 299 || b != "from live" || sawToken != "tok" {
		t.Errorf("control call: %d %q, node saw token %q", st, b, sawToken)
	}
	host := "8080-" + onLive + ".example.test"
	if st, _ := do("GET", "/x", map[string]string{"Host": host}); st != 299 || sawHost != host {
		t.Errorf("sandbox host: %d, node saw Host %q", st, sawHost)
	}
	st, b := do("GET", "/x", map[string]string{"E2b-Sandbox-Id": onDead, "E2b-Sandbox-Port": "49983"})
	var pe struct {
		SandboxID string `json:"sandboxId"`
		Code      int    `json:"code"`
	}
	json.Unmarshal([]byte(b), &pe)
	if st != 502 || pe.SandboxID != onDead || pe.Code != 502 {
		t.Errorf("traffic for a dead node's sandbox: %d %s", st, b)
	}
	// The control plane of a dead node's sandbox: a live node answers
	// (its 404 in the real cluster).
	if st, b := do("GET", "/sandboxes/"+onDead, map[string]string{"X-API-Key": "key"}); st != 299 || b != "from live" {
		t.Errorf("dead node's sandbox, control plane: %d %q", st, b)
	}
	if st, _ := do("GET", "/secrets", map[string]string{"X-API-Key": "key"}); st != 501 {
		t.Errorf("/secrets: %d, want 501", st)
	}
	// Volumes go to their nodes (TestVolumesFollowTheirNode).
	if st, b := do("POST", "/volumes", map[string]string{"X-API-Key": "key"}); st != 299 || b != "from live" {
		t.Errorf("/volumes: %d %q, want the node's answer", st, b)
	}
	if st, b := do("GET", "/volumecontent/00000000-0000-4000-8000-000000000000/dir?path=/", map[string]string{"Authorization": "Bearer fvt1.x.y"}); st != 299 || b != "from live" {
		t.Errorf("/volumecontent: %d %q, want the node's answer", st, b)
	}
	// The router serves /mcp itself when given a handler
	// (TestMCPSeesTheCluster), and never passes it to a node.
	if st, b := do("POST", "/mcp", map[string]string{"X-API-Key": "key"}); st != 501 || b == "from live" {
		t.Errorf("/mcp without Options.MCP: %d %q, want the router's own 501", st, b)
	}
	// Nodes sharing one database answer /secrets alike: any one does; the
	// per-node routes go to the nodes as without it.
	shared := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok", Domain: "example.test", SharedRecords: true, MCP: mcp.ClusterHandler}))
	defer shared.Close()
	for path, want := range map[string]int{"/secrets": 299, "/secrets/tok": 299, "/usage": 299, "/audit": 299, "/mcp": 405,
		"/volumes": 299, "/volumes/00000000-0000-4000-8000-000000000000": 299, "/volumecontent/00000000-0000-4000-8000-000000000000/dir": 299} {
		req, _ := http.NewRequest("GET", shared.URL+path, nil)
		req.Header.Set("X-API-Key", "key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("shared records: GET %s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	// A team's key is the nodes' to check when they share one database;
	// otherwise the router refuses it, and a request without a key.
	for _, c := range []struct {
		url  string
		hdr  map[string]string
		want int
	}{
		{shared.URL, map[string]string{"X-API-Key": "e2b_team"}, 299},
		{shared.URL, map[string]string{"Authorization": "Bearer sk_e2b_team"}, 299},
		{shared.URL, nil, 401},
		{shared.URL + "/metrics?", map[string]string{"X-API-Key": "e2b_team"}, 401},
		{srv.URL, map[string]string{"X-API-Key": "e2b_team"}, 401},
		{srv.URL, map[string]string{"Authorization": "Bearer sk_e2b_team"}, 401},
	} {
		u := c.url + "/sandboxes/" + onLive
		if strings.HasSuffix(c.url, "?") {
			u = strings.TrimSuffix(c.url, "?")
		}
		req, _ := http.NewRequest("GET", u, nil)
		for k, v := range c.hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("GET %s with %v = %d, want %d", u, c.hdr, resp.StatusCode, c.want)
		}
	}
	if notThroughRouter[0] != "/secrets" {
		t.Errorf("notThroughRouter changed: %v", notThroughRouter)
	}
	rt.SetDraining()
	if st, _ := do("GET", "/health", nil); st != 503 {
		t.Errorf("health while draining: %d", st)
	}
}

// A draining router closes the connection of every answer it gives, so
// that a client's next request takes a new connection (which a Service
// sends to a ready router) instead of one kept alive to this router
// until its listener closes; before, it keeps connections alive.
func TestDrainingClosesConnections(t *testing.T) {
	n1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from n1") }))
	defer n1.Close()
	nodes := fakeNodes{cluster.Tag("n1"): node("n1", n1.URL, 10, 0)}
	rt := New(Options{Nodes: nodes, APIKey: "key", Token: "tok"})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	id := cluster.NewID(cluster.Tag("n1"))
	get := func(path string, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	sandbox := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}
	if resp := get("/health", nil); resp.Close {
		t.Errorf("a router serving closes the connection of its health answer")
	}
	if resp := get("/", sandbox); resp.Close {
		t.Errorf("a router serving closes the connection of a sandbox's answer")
	}
	rt.SetDraining()
	for _, c := range []struct {
		path string
		hdr  map[string]string
	}{{"/health", nil}, {"/", sandbox}, {"/sandboxes", map[string]string{"X-API-Key": "key"}}} {
		if resp := get(c.path, c.hdr); !resp.Close {
			t.Errorf("GET %s %v while draining: %d, its connection kept alive", c.path, c.hdr, resp.StatusCode)
		}
	}
}

func TestLabelSample(t *testing.T) {
	for in, want := range map[string]string{
		`fence_up 1`:                 `fence_up{node="n"} 1`,
		`fence_x{a="b"} 2`:           `fence_x{node="n",a="b"} 2`,
		`fence_y{} 3`:                `fence_y{node="n"} 3`,
		`fence_z{a="has { brace"} 4`: `fence_z{node="n",a="has { brace"} 4`,
	} {
		if got := labelSample(in, "n"); got != want {
			t.Errorf("labelSample(%q) = %q, want %q", in, got, want)
		}
	}
	_ = strings.TrimSpace
}

// TestSignedUploadFindsItsNode: a signed upload names no sandbox; the
// router probes the nodes without the body, and only the one that holds
// the sandbox gets the request and its whole body.
func TestSignedUploadFindsItsNode(t *testing.T) {
	const payload = "the uploaded file's bytes"
	got := make(chan string, 4)
	mk := func(owner bool) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(api.HeaderSignatureProbe) == "" && !owner {
				t.Errorf("a node that holds no sandbox for the signature got the request itself")
			}
			if !owner {
				w.WriteHeader(http.StatusUnauthorized)
				io.WriteString(w, `{"code":401,"message":"invalid signature"}`)
				return
			}
			if r.Header.Get(api.HeaderSignatureProbe) != "" {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			b, _ := io.ReadAll(r.Body)
			got <- string(b)
			w.WriteHeader(http.StatusOK)
		}))
	}
	nodes := fakeNodes{}
	for i, owner := range []bool{false, false, true, false} {
		srv := mk(owner)
		defer srv.Close()
		name := string(rune('a'+i)) + "node"
		nodes[cluster.Tag(name)] = node(name, srv.URL, 10, 0)
	}
	rt := New(Options{Nodes: nodes, APIKey: "key", Token: "tok"})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	for range 3 { // the nodes come in map order: the owner's place varies
		resp, err := http.Post(srv.URL+"/files?path=/tmp/x&signature=v1_x", "application/octet-stream", strings.NewReader(payload))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("signed upload: %d, want 200 from the owning node", resp.StatusCode)
		}
		if b := <-got; b != payload {
			t.Fatalf("the owning node got %q, want %q", b, payload)
		}
	}
}

// TestSignedExpiredIsTheOwnersAnswer: the owning node's "expired" is the
// answer, not the next node's "invalid signature".
func TestSignedExpiredIsTheOwnersAnswer(t *testing.T) {
	nodes := fakeNodes{}
	for i, msg := range []string{"invalid signature", "signature is already expired", "invalid signature"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"code":401,"message":"`+msg+`"}`)
		}))
		defer srv.Close()
		name := string(rune('a'+i)) + "node"
		nodes[cluster.Tag(name)] = node(name, srv.URL, 10, 0)
	}
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok"}))
	defer srv.Close()
	for range 6 {
		resp, err := http.Get(srv.URL + "/files?path=/tmp/x&signature=v1_x")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(b), "already expired") {
			t.Fatalf("got %d %s, want the owner's 401 already expired", resp.StatusCode, b)
		}
	}
}

// A node that answers a sandbox stream before the request body has ended
// (its first event while the client still sends) keeps streaming through
// the router: the body is not closed under the transport at the first
// response write, which made the transport drop the node's connection
// and cut the client's stream.
func TestStreamAnsweredBeforeTheBodyEnds(t *testing.T) {
	node1 := httptest.NewServer(testutil.EarlyAnswer())
	defer node1.Close()
	nodes := fakeNodes{cluster.Tag("n1"): node("n1", node1.URL, 10, 0)}
	rt := New(Options{Nodes: nodes, APIKey: "key", Token: "tok", Domain: "example.test"})
	srv := httptest.NewServer(rt)
	defer srv.Close()
	testutil.StreamAnsweredEarly(t, srv.URL+"/process.Process/Connect",
		map[string]string{"E2b-Sandbox-Id": cluster.NewID(cluster.Tag("n1")), "E2b-Sandbox-Port": "49983"})
}

// fakeVolumeNode answers like a node holding vols, whose tokens are
// "tok-<name>"; keys gets the API key of every request.
func fakeVolumeNode(t *testing.T, name string, keys *sync.Map, vols ...api.Volume) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("X-API-Key"); k != "" {
			keys.Store(k, true)
		}
		switch {
		case r.Method == "GET" && r.URL.Path == "/volumes":
			writeJSON(w, 200, vols)
		case strings.HasPrefix(r.URL.Path, "/volumecontent/"):
			if r.Header.Get("Authorization") != "Bearer tok-"+name {
				writeErr(w, 401, "invalid volume token: unauthenticated")
				return
			}
			io.WriteString(w, r.Method+" "+r.URL.Path+" from "+name)
		default:
			io.WriteString(w, r.Method+" "+r.URL.Path+" from "+name)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestVolumesFollowTheirNode runs with and without shared records: on one
// shared database a volume still lives on one node (its records are the
// node's), and a team's key goes to the nodes, which check it.
func TestVolumesFollowTheirNode(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "own records", true: "shared records"}[shared], func(t *testing.T) { testVolumesFollowTheirNode(t, shared) })
	}
}

func testVolumesFollowTheirNode(t *testing.T, shared bool) {
	var keys sync.Map
	key := "key"
	if shared {
		key = "e2b_team"
	}
	a := fakeVolumeNode(t, "a", &keys, api.Volume{VolumeID: "11111111-1111-4111-8111-111111111111", Name: "va"})
	b := fakeVolumeNode(t, "b", &keys, api.Volume{VolumeID: "22222222-2222-4222-8222-222222222222", Name: "vb"})
	nodes := fakeNodes{cluster.Tag("a"): node("a", a.URL, 10, 0, "base"), cluster.Tag("b"): node("b", b.URL, 10, 0, "base")}
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok", SharedRecords: shared}))
	defer srv.Close()
	do := func(method, path, auth, body string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(got)
	}
	for range 5 { // placement is random: each must hold every time
		if st, got := do("GET", "/volumes/22222222-2222-4222-8222-222222222222", "", ""); st != 200 || !strings.HasSuffix(got, "from b") {
			t.Errorf("GET /volumes/{id of b}: %d %q", st, got)
		}
		if st, got := do("DELETE", "/volumes/11111111-1111-4111-8111-111111111111", "", ""); st != 200 || !strings.HasSuffix(got, "from a") {
			t.Errorf("DELETE /volumes/{id of a}: %d %q", st, got)
		}
		if st, got := do("PUT", "/volumecontent/22222222-2222-4222-8222-222222222222/file?path=/x", "tok-b", "data"); st != 200 || got != "PUT /volumecontent/22222222-2222-4222-8222-222222222222/file from b" {
			t.Errorf("PUT content with b's token: %d %q", st, got)
		}
		if st, got := do("POST", "/sandboxes", "", `{"templateID":"base","volumeMounts":[{"name":"va","path":"/a"}]}`); st != 200 || got != "POST /sandboxes from a" {
			t.Errorf("create mounting va: %d %q", st, got)
		}
	}
	if st, got := do("GET", "/volumecontent/22222222-2222-4222-8222-222222222222/file?path=/x", "forged", ""); st != 401 || !strings.Contains(got, "invalid volume token") {
		t.Errorf("a token no node takes: %d %q", st, got)
	}
	if st, got := do("POST", "/v2/sandboxes", "", `{"templateID":"base","volumeMounts":[{"name":"va","path":"/a"},{"name":"vb","path":"/b"}]}`); st != 400 || !strings.Contains(got, "different nodes") {
		t.Errorf("create mounting volumes of two nodes: %d %q", st, got)
	}
	if st, got := do("POST", "/volumes", "", `{"name":"vb"}`); st != 400 || !strings.Contains(got, "already exists") {
		t.Errorf("create of a name used on a node: %d %q", st, got)
	}
	var all []api.Volume
	if st, got := do("GET", "/volumes", "", ""); st != 200 || json.Unmarshal([]byte(got), &all) != nil || len(all) != 2 {
		t.Errorf("GET /volumes: %d %q, want both nodes' volumes", st, got)
	}
	keys.Range(func(k, _ any) bool {
		if k != key {
			t.Errorf("a node saw the API key %q, want only the caller's %q", k, key)
		}
		return true
	})
}

// TestListsPassTeamID: a list asks every node with the caller's X-Team-ID
// (the admin acting for a team, as the dashboard's team filter does).
func TestListsPassTeamID(t *testing.T) {
	n := newUINode(t)
	nodes := fakeNodes{cluster.Tag("a"): node("a", n.srv.URL, 10, 0)}
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "e2b_routerkey", Token: "tok"}))
	defer srv.Close()
	resp, body := uiClient{t: t, url: srv.URL}.do("GET", "/v2/sandboxes", "", map[string]string{"X-API-Key": "e2b_routerkey", "X-Team-ID": "t2"})
	if h, _ := n.last(); resp.StatusCode != 200 || h == nil || h.Get("X-Team-ID") != "t2" {
		t.Errorf("GET /v2/sandboxes with X-Team-ID = %d %s; the node got X-Team-ID %q", resp.StatusCode, body, h.Get("X-Team-ID"))
	}
}
