package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/mcp"
)

// fakeRecord is a record of a fake node's audit trail; team is whose it is.
type fakeRecord struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Type string    `json:"type"`
	team string
}

// fakeAuditNode serves /audit like a node: records after ?after=, up to
// ?limit=, oldest first; the admin key "key" reads all, "e2b_<team>"
// its team's, any other key is refused. keys gets every key it saw.
func fakeAuditNode(t *testing.T, recs []fakeRecord, keys *sync.Map) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		keys.Store(key, true)
		team, ok := strings.CutPrefix(key, "e2b_")
		if key != "key" && !ok {
			writeErr(w, 401, "invalid API key")
			return
		}
		q := r.URL.Query()
		after, _ := strconv.ParseUint(q.Get("after"), 10, 64)
		limit := 1000
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				writeErr(w, 400, "limit must be 1 to 10000, got "+strconv.Quote(v))
				return
			}
			limit = n
		}
		out := []fakeRecord{}
		for _, rec := range recs {
			if rec.Seq > after && len(out) < limit && (key == "key" || rec.team == team) {
				out = append(out, rec)
			}
		}
		writeJSON(w, 200, out)
	}))
	t.Cleanup(srv.Close)
	return srv
}

type mergedRecord struct {
	Node string    `json:"node"`
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Type string    `json:"type"`
}

func getJSON(t *testing.T, url, key string, into any) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if into != nil && resp.StatusCode == 200 {
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatalf("GET %s: %v in %s", url, err, b)
		}
	}
	return resp, string(b)
}

// TestAuditMergedAcrossNodes checks GET /audit through the router: the
// nodes' records merged by time (ties by node, then seq), each naming its
// node; pages of limit that follow the cursor give every record once; a
// node that does not answer is named; a team's key reaches the nodes (not
// the router's) and reads its team's records alone.
func TestAuditMergedAcrossNodes(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var keys sync.Map
	a := fakeAuditNode(t, []fakeRecord{{1, at(1), "x", "t1"}, {2, at(3), "x", "t2"}, {3, at(3), "x", "t1"}, {4, at(7), "x", "t1"}}, &keys)
	b := fakeAuditNode(t, []fakeRecord{{1, at(2), "y", "t1"}, {2, at(3), "y", "t2"}, {3, at(5), "y", "t1"}}, &keys)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	nodes := fakeNodes{cluster.Tag("a"): node("a", a.URL, 10, 0), cluster.Tag("b"): node("b", b.URL, 10, 0)}
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok", SharedRecords: true}))
	defer srv.Close()

	want := []string{"a:1", "b:1", "a:2", "a:3", "b:2", "b:3", "a:4"}
	var all []mergedRecord
	resp, body := getJSON(t, srv.URL+"/audit", "key", &all)
	if resp.StatusCode != 200 || fmt.Sprint(ids(all)) != fmt.Sprint(want) {
		t.Fatalf("GET /audit = %d %s, want %v", resp.StatusCode, body, want)
	}
	if got := resp.Header.Get(api.HeaderAuditCursor); got != "a:4,b:3" {
		t.Errorf("cursor after everything: %q", got)
	}
	// Pages of 3 following the cursor: every record once, in order.
	var paged []string
	after := ""
	for range 10 {
		var page []mergedRecord
		resp, body := getJSON(t, srv.URL+"/audit?limit=3&after="+after, "key", &page)
		if resp.StatusCode != 200 || len(page) > 3 {
			t.Fatalf("page after %q: %d %s", after, resp.StatusCode, body)
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, ids(page)...)
		after = resp.Header.Get(api.HeaderAuditCursor)
	}
	if fmt.Sprint(paged) != fmt.Sprint(want) {
		t.Errorf("paged: %v, want %v", paged, want)
	}
	var mine []mergedRecord
	getJSON(t, srv.URL+"/audit", "e2b_t2", &mine)
	if fmt.Sprint(ids(mine)) != "[a:2 b:2]" {
		t.Errorf("team t2's records: %v", ids(mine))
	}
	keys.Range(func(k, _ any) bool {
		if k != "key" && k != "e2b_t2" {
			t.Errorf("a node saw the key %q", k)
		}
		return true
	})
	if resp, body := getJSON(t, srv.URL+"/audit?after=4", "key", nil); resp.StatusCode != 400 || !strings.Contains(body, "cursor") {
		t.Errorf("a node's seq as after: %d %s, want 400", resp.StatusCode, body)
	}
	if resp, body := getJSON(t, srv.URL+"/audit?limit=x", "key", nil); resp.StatusCode != 400 || !strings.Contains(body, "limit") {
		t.Errorf("a bad limit: %d %s, want the nodes' 400", resp.StatusCode, body)
	}
	if resp, body := getJSON(t, srv.URL+"/audit", "unknown", nil); resp.StatusCode != 401 {
		t.Errorf("a key the nodes refuse: %d %s, want their 401", resp.StatusCode, body)
	}

	nodes[cluster.Tag("c")] = node("c", dead.URL, 10, 0)
	var partial []mergedRecord
	resp, _ = getJSON(t, srv.URL+"/audit", "key", &partial)
	if resp.StatusCode != 200 || len(partial) != len(want) || resp.Header.Get(api.HeaderUnansweredNodes) != "c" {
		t.Errorf("with node c dead: %d, %d records, %s %q", resp.StatusCode, len(partial), api.HeaderUnansweredNodes,
			resp.Header.Get(api.HeaderUnansweredNodes))
	}
}

func ids(recs []mergedRecord) []string {
	out := []string{}
	for _, r := range recs {
		out = append(out, r.Node+":"+strconv.FormatUint(r.Seq, 10))
	}
	return out
}

// TestUsageSummed checks GET /usage through the router: every node's
// sandboxes by creation time, the totals of a key summed, a node that
// does not answer named.
func TestUsageSummed(t *testing.T) {
	node1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"sandboxes":[{"sandbox_id":"s1","actor":"k1","created_at":"2026-12-01T10:00:03Z","cpu_seconds":1.5}],
			"keys":[{"actor":"k1","sandboxes":1,"cpu_seconds":1.5,"egress_bytes_out":10}]}`)
	}))
	defer node1.Close()
	node2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("team") != "t" {
			t.Errorf("node 2 got query %q", r.URL.RawQuery)
		}
		io.WriteString(w, `{"sandboxes":[{"sandbox_id":"s2","actor":"k1","created_at":"2026-12-01T10:00:01Z","cpu_seconds":2},
			{"sandbox_id":"s3","actor":"k2","created_at":"2026-12-01T10:00:05Z","cpu_seconds":0.25}],
			"keys":[{"actor":"k1","sandboxes":1,"cpu_seconds":2,"egress_bytes_out":5},{"actor":"k2","sandboxes":1,"cpu_seconds":0.25,"egress_bytes_out":0}]}`)
	}))
	defer node2.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	nodes := fakeNodes{cluster.Tag("n1"): node("n1", node1.URL, 10, 0), cluster.Tag("n2"): node("n2", node2.URL, 10, 0),
		cluster.Tag("n3"): node("n3", dead.URL, 10, 0)}
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok"}))
	defer srv.Close()
	var rep struct {
		Sandboxes []struct {
			ID string `json:"sandbox_id"`
		} `json:"sandboxes"`
		Keys []struct {
			Actor     string  `json:"actor"`
			Sandboxes int     `json:"sandboxes"`
			CPU       float64 `json:"cpu_seconds"`
			Out       int64   `json:"egress_bytes_out"`
		} `json:"keys"`
	}
	resp, body := getJSON(t, srv.URL+"/usage?team=t", "key", &rep)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /usage: %d %s", resp.StatusCode, body)
	}
	if got := fmt.Sprint(rep.Sandboxes); got != "[{s2} {s1} {s3}]" {
		t.Errorf("sandboxes: %s, want by creation time", got)
	}
	if got := fmt.Sprint(rep.Keys); got != "[{k1 2 3.5 15} {k2 1 0.25 0}]" {
		t.Errorf("keys: %s, want summed per actor", got)
	}
	if got := resp.Header.Get(api.HeaderUnansweredNodes); got != "n3" {
		t.Errorf("%s: %q, want n3", api.HeaderUnansweredNodes, got)
	}
}

// TestAuditVerifyByNode checks GET /audit/verify through the router: each
// node's report by name, intact only if every one is.
func TestAuditVerifyByNode(t *testing.T) {
	answer := func(intact bool, records int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"intact":%v,"records":%d}`, intact, records)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	nodes := fakeNodes{cluster.Tag("a"): node("a", answer(true, 3).URL, 10, 0)}
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok"}))
	defer srv.Close()
	var out struct {
		Intact  bool                       `json:"intact"`
		Records int                        `json:"records"`
		Nodes   map[string]json.RawMessage `json:"nodes"`
	}
	getJSON(t, srv.URL+"/audit/verify", "key", &out)
	if !out.Intact || out.Records != 3 || string(out.Nodes["a"]) != `{"intact":true,"records":3}` {
		t.Errorf("one intact node: %+v", out)
	}
	nodes[cluster.Tag("b")] = node("b", answer(false, 4).URL, 10, 0)
	out.Intact = true
	getJSON(t, srv.URL+"/audit/verify", "key", &out)
	if out.Intact || out.Records != 7 || len(out.Nodes) != 2 {
		t.Errorf("a broken node: %+v, want not intact", out)
	}
	// A node that does not answer: not verified, so not intact.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	nodes[cluster.Tag("b")] = node("b", dead.URL, 10, 0)
	var partial struct {
		Intact     bool     `json:"intact"`
		Unanswered []string `json:"unanswered"`
	}
	partial.Intact = true
	resp, _ := getJSON(t, srv.URL+"/audit/verify", "key", &partial)
	if partial.Intact || fmt.Sprint(partial.Unanswered) != "[b]" || resp.Header.Get(api.HeaderUnansweredNodes) != "b" {
		t.Errorf("node b dead: %+v, header %q", partial, resp.Header.Get(api.HeaderUnansweredNodes))
	}
}

// fakeStreamNode serves /audit/stream: the records after ?after= as
// events, then holds the stream open. afters gets each ?after=.
func fakeStreamNode(t *testing.T, name string, n int, afters chan<- string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		afters <- name + "=" + r.URL.Query().Get("after")
		after, _ := strconv.Atoi(r.URL.Query().Get("after"))
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for seq := after + 1; seq <= n; seq++ {
			fmt.Fprintf(w, "id: %d\ndata: {\"seq\":%d,\"type\":\"t\"}\n\n", seq, seq)
		}
		fmt.Fprint(w, ": keep-alive\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestAuditStreamMerged checks GET /audit/stream through the router: the
// events of every node, each naming its node, with ids that resume every
// node where it was.
func TestAuditStreamMerged(t *testing.T) {
	afters := make(chan string, 16)
	nodes := fakeNodes{cluster.Tag("a"): node("a", fakeStreamNode(t, "a", 2, afters).URL, 10, 0),
		cluster.Tag("b"): node("b", fakeStreamNode(t, "b", 3, afters).URL, 10, 0)}
	srv := httptest.NewServer(New(Options{Nodes: nodes, APIKey: "key", Token: "tok"}))
	defer srv.Close()
	read := func(lastID string, n int) (got []string, last string) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/audit/stream", nil)
		req.Header.Set("X-API-Key", "key")
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		for len(got) < n && sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "id: "); ok {
				last = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				var rec mergedRecord
				json.Unmarshal([]byte(v), &rec)
				got = append(got, rec.Node+":"+strconv.FormatUint(rec.Seq, 10))
			}
		}
		return got, last
	}
	got, last := read("", 5)
	if len(got) != 5 || last != "a:2,b:3" {
		t.Fatalf("merged stream: %v, last id %q", got, last)
	}
	for _, want := range []string{"a:1", "a:2", "b:1", "b:2", "b:3"} {
		if !strings.Contains(fmt.Sprint(got), want) {
			t.Errorf("merged stream %v lacks %s", got, want)
		}
	}
	drain(afters)
	// Resuming: each node from its own seq, nothing sent again.
	got, _ = read("a:1,b:3", 1)
	if fmt.Sprint(got) != "[a:2]" {
		t.Errorf("resumed at a:1,b:3: %v, want [a:2]", got)
	}
	seen := drain(afters)
	if !strings.Contains(seen, "a=1") || !strings.Contains(seen, "b=3") {
		t.Errorf("nodes asked for %s, want a=1 and b=3", seen)
	}
}

func drain(c chan string) string {
	var out []string
	for {
		select {
		case s := <-c:
			out = append(out, s)
		default:
			return strings.Join(out, " ")
		}
	}
}

// TestMCPSeesTheCluster checks /mcp through the router: the router serves
// MCP itself, statelessly, and its tools go through the router, so a
// listing holds the sandboxes of every node, asked with the caller's key.
func TestMCPSeesTheCluster(t *testing.T) {
	var keys sync.Map
	list := func(id string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			keys.Store(r.Header.Get("X-API-Key"), true)
			fmt.Fprintf(w, `[{"sandboxID":%q,"templateID":"base","state":"running","startedAt":"2026-12-01T10:00:00Z","endAt":"2026-12-01T11:00:00Z"}]`, id)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	idA, idB := cluster.NewID(cluster.Tag("a")), cluster.NewID(cluster.Tag("b"))
	nodes := fakeNodes{cluster.Tag("a"): node("a", list(idA).URL, 10, 0), cluster.Tag("b"): node("b", list(idB).URL, 10, 0)}
	rt := New(Options{Nodes: nodes, APIKey: "key", Token: "tok", SharedRecords: true, MCP: mcp.ClusterHandler})
	defer rt.Close()
	srv := httptest.NewServer(rt)
	defer srv.Close()
	cl := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := cl.Connect(context.Background(), &sdk.StreamableClientTransport{Endpoint: srv.URL + "/mcp",
		HTTPClient: &http.Client{Transport: keyTransport("e2b_team")}, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "list_sandboxes", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("list_sandboxes: %v %+v", err, res)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if !strings.Contains(string(b), idA) || !strings.Contains(string(b), idB) {
		t.Errorf("list_sandboxes through the router: %s, want the sandboxes of both nodes", b)
	}
	keys.Range(func(k, _ any) bool {
		if k != "e2b_team" {
			t.Errorf("a node saw the key %q, want the caller's", k)
		}
		return true
	})
}

type keyTransport string

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-API-Key", string(k))
	return http.DefaultTransport.RoundTrip(r)
}
