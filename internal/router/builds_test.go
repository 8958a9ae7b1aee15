package router

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/cluster"
)

// A build's routes reach one node per credential, whichever router and
// in whatever order; different keys spread over the nodes; a drained node
// takes none; an upload link goes to the node whose tag starts its token.
func TestBuildRoutesMeetOneNode(t *testing.T) {
	seen := map[string]string{} // path → node name
	nodes := fakeNodes{}
	for _, name := range []string{"a", "b", "c"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Fence-Cluster-Token") != "tok" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			_, _ = io.WriteString(w, name)
		}))
		defer srv.Close()
		n := node(name, srv.URL, 10, 0)
		nodes[n.Tag] = n
	}
	routers := []*httptest.Server{httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok", SharedRecords: true})),
		httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok", SharedRecords: true}))}
	for _, r := range routers {
		defer r.Close()
	}
	do := func(srv *httptest.Server, method, path, key string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	build := [][2]string{{"POST", "/v3/templates"}, {"GET", "/templates/t1/files/" + strings.Repeat("a", 64)},
		{"POST", "/v2/templates/t1/builds/b1"}, {"GET", "/templates/t1/builds/b1/status"},
		{"GET", "/templates/t1/builds/b1/logs"}, {"GET", "/templates/t1/builds/b1/logs/stream"}}
	used := map[string]bool{}
	for i := range 12 {
		key := "e2b_team" + strings.Repeat("x", i)
		var at string
		for j, rt := range build {
			st, name := do(routers[j%2], rt[0], rt[1], key)
			if st != 200 {
				t.Fatalf("%s %s: %d %q", rt[0], rt[1], st, name)
			}
			if at == "" {
				at = name
			} else if name != at {
				t.Errorf("key %d: %s %s went to node %s, its register to %s", i, rt[0], rt[1], name, at)
			}
			seen[rt[1]] = name
		}
		used[at] = true
	}
	if len(used) < 2 {
		t.Errorf("12 keys' builds all went to %v, want them spread", used)
	}
	// A drained node takes no build.
	for tag, n := range nodes {
		if used[n.Name] {
			n.Drained = true
			nodes[tag] = n
			break
		}
	}
	for i := range 12 {
		_, name := do(routers[0], "POST", "/v3/templates", "e2b_team"+strings.Repeat("x", i))
		if n := nodes[cluster.Tag(name)]; n.Drained {
			t.Errorf("a register went to drained node %s", name)
		}
	}
	// The other template routes are not pinned (any node answers them);
	// an upload link needs no key and goes by its token's tag.
	for _, name := range []string{"a", "b", "c"} {
		if st, got := do(routers[1], "PUT", uploadPrefix+cluster.Tag(name)+strings.Repeat("k", 40), ""); st != 200 || got != name {
			t.Errorf("upload link of node %s: %d %q", name, st, got)
		}
	}
	for _, path := range []string{uploadPrefix + "zzzzz" + strings.Repeat("k", 40), uploadPrefix + "ab"} {
		if st, got := do(routers[0], "PUT", path, ""); st != 404 {
			t.Errorf("upload link %s: %d %q, want 404", path, st, got)
		}
	}
	if st, _ := do(routers[0], "POST", "/v3/templates", ""); st != 401 {
		t.Errorf("register without a key: %d, want 401", st)
	}
}

func TestIsBuildRoute(t *testing.T) {
	for _, c := range []struct {
		method, path string
		want         bool
	}{
		{"POST", "/v3/templates", true}, {"GET", "/templates", false}, {"GET", "/v2/templates", false},
		{"GET", "/templates/t/files/h", true}, {"POST", "/v2/templates/t/builds/b", true},
		{"GET", "/templates/t/builds/b/status", true}, {"GET", "/templates/t/builds/b/logs/stream", true},
		{"GET", "/templates/t", false}, {"DELETE", "/templates/t", false}, {"GET", "/templates/aliases/x", false},
		{"GET", "/templates/t/tags", false}, {"POST", "/templates/tags", false}, {"GET", "/templates/t/builds/b/other", false},
	} {
		r := httptest.NewRequest(c.method, c.path, nil)
		if got := isBuildRoute(r); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.method, c.path, got, c.want)
		}
	}
}
