package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
)

// A sandbox whose tag names a drained node is served where the nodes say
// it moved: its connect goes to a placeable node while it waits in the
// registry, and every later call and its traffic to the node that took it
// over. A sandbox never moved stays with its tag's node; without shared
// records the router asks nothing.
func TestMovedSandboxFollowsItsNode(t *testing.T) {
	var mu sync.Mutex
	took := "" // the node that took the moved sandbox over
	seen := []string{}
	moved := cluster.NewID(cluster.Tag("drained"))
	stays := cluster.NewID(cluster.Tag("drained"))
	fake := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if strings.HasPrefix(r.URL.Path, "/moved-sandboxes/") {
				if r.Header.Get("X-API-Key") == "" || r.Header.Get(cluster.HeaderToken) != "tok" {
					w.WriteHeader(http.StatusUnauthorized)
					return
				}
				if !strings.Contains(r.URL.Path, moved) {
					w.WriteHeader(http.StatusNotFound)
					return
				}
				json.NewEncoder(w).Encode(api.SandboxLocation{SandboxID: moved, Node: took, Waiting: took == ""})
				return
			}
			seen = append(seen, name+" "+r.Method+" "+r.URL.Path+" "+r.Header.Get(api.HeaderSandboxID))
			if strings.HasSuffix(r.URL.Path, "/connect") && name != "drained" {
				took = name
			}
			io.WriteString(w, name)
		}))
	}
	nodes := fakeNodes{}
	for _, n := range []string{"drained", "other"} {
		srv := fake(n)
		defer srv.Close()
		nodes[cluster.Tag(n)] = node(n, srv.URL, 10, 0)
	}
	d := nodes[cluster.Tag("drained")]
	d.Drained = true
	nodes[cluster.Tag("drained")] = d
	for _, shared := range []bool{false, true} {
		mu.Lock()
		took, seen = "", nil
		mu.Unlock()
		rt := New(Options{Nodes: nodes, APIKey: "key", Token: "tok", SharedRecords: shared})
		srv := httptest.NewServer(rt)
		do := func(method, path string, hdr map[string]string) string {
			req, _ := http.NewRequest(method, srv.URL+path, nil)
			req.Header.Set("X-API-Key", "key")
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		got := []string{
			do("GET", "/sandboxes/"+moved, nil), // waiting: not a resume
			do("POST", "/v2/sandboxes/"+moved+"/connect", nil),
			do("GET", "/sandboxes/"+moved, nil),
			do("GET", "/health", map[string]string{api.HeaderSandboxID: moved, "E2b-Sandbox-Port": "49983"}),
			do("GET", "/sandboxes/"+stays, nil),
		}
		srv.Close()
		want := "drained other other other drained"
		if !shared {
			want = "drained drained drained drained drained"
		}
		if strings.Join(got, " ") != want {
			mu.Lock()
			t.Errorf("shared %v: answered by %q, want %q; nodes saw %q", shared, got, want, seen)
			mu.Unlock()
		}
	}
}
