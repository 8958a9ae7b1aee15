package router

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/cluster"
)

// TestAuditStreamMerges: GET /audit/stream through the router carries
// the records of every node's stream, without the nodes' ids, with the
// caller's credential sent to each; when every node refuses, the refusal
// is passed on.
func TestAuditStreamMerges(t *testing.T) {
	release := make(chan struct{})
	stream := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-API-Key") != "e2b_team" || r.Header.Get(cluster.HeaderToken) != "tok" {
				writeErr(w, http.StatusUnauthorized, "invalid API key")
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, ": hello\n\nid: 7\ndata: {\"node\":%q}\n\n", name)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := stream("a"), stream("b")
	nodes := fakeNodes{cluster.Tag("a"): node("a", a.URL, 10, 0), cluster.Tag("b"): node("b", b.URL, 10, 0)}
	rt := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "e2b_routerkey", Token: "tok", SharedRecords: true}))
	defer rt.Close()
	defer close(release)

	req, _ := http.NewRequest("GET", rt.URL+"/audit/stream?type=sandbox.create", nil)
	req.Header.Set("X-API-Key", "e2b_team")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /audit/stream = %d %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	got := map[string]bool{}
	for len(got) < 2 && sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "id:") || strings.HasPrefix(line, ":") {
			t.Errorf("the merge passed a node's line %q", line)
		}
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			got[d] = true
		}
	}
	if !got[`{"node":"a"}`] || !got[`{"node":"b"}`] {
		t.Errorf("merged stream has %v, want both nodes' records", got)
	}

	req, _ = http.NewRequest("GET", rt.URL+"/audit/stream", nil)
	req.Header.Set("X-API-Key", "e2b_wrong")
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "invalid API key") {
		t.Errorf("GET /audit/stream with a key every node refuses = %d %s, want their 401", resp2.StatusCode, body)
	}
}
