package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/mcp"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// routedRecord is a record of GET /audit through the router.
type routedRecord struct {
	Node    string    `json:"node"`
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Sandbox string    `json:"sandbox"`
	Actor   string    `json:"actor"`
}

// TestScaleoutPerNodeRoutes runs two nodes on one PostgreSQL database
// behind a router with --shared-database, and drives what each node keeps
// of its own through the router: a team's volume (its content, a sandbox
// mounting it placed on its node; another team gets a missing volume's
// 404), /mcp (its tools see the sandboxes of both nodes, a team's only
// its own), /audit merged by time with pages that follow the cursor,
// /audit/stream, /audit/verify, and /usage summed over the nodes; a
// team's key reads its team's records alone.
func TestScaleoutPerNodeRoutes(t *testing.T) {
	testutil.RequireRoot(t)
	k, token, key := startCluster(t)
	templatesDir(t)
	dsn := pgtest.New(t).Database(t)
	sealing := clusterKey(t)
	nodes := map[string]*daemon{}
	byTag := map[string]string{}
	for _, n := range []string{"node-a", "node-b"} {
		nodes[n] = startNode(t, k, n, key, "--database", dsn, "--secrets-key", sealing)
		byTag[cluster.Tag(n)] = n
	}
	r := startRouter(t, k, key, 0, "--shared-database")
	eventually(t, 30*time.Second, "router sees 2 placeable nodes", func() bool {
		st, live, pl := r.health()
		return st == 200 && live == 2 && pl == 2
	})
	via := &daemon{t: t, URL: r.URL, Key: key, Client: client.New(r.URL, key)}

	// Team b and its key, made through the router.
	rr := via.do(t, "POST", "/admin/teams", key, strings.NewReader(`{"name":"team-b"}`), nil)
	var teamB api.TeamInfo
	if rr.Status != 201 || json.Unmarshal(rr.Body, &teamB) != nil {
		t.Fatalf("POST /admin/teams = %d %s", rr.Status, rr.Body)
	}
	rr = via.do(t, "POST", "/admin/teams/"+teamB.TeamID+"/api-keys", key, strings.NewReader(`{"name":"b"}`), nil)
	var keyB api.CreatedTeamAPIKey
	if rr.Status != 201 || json.Unmarshal(rr.Body, &keyB) != nil {
		t.Fatalf("POST team b's key = %d %s", rr.Status, rr.Body)
	}
	viaB := &daemon{t: t, URL: r.URL, Key: keyB.Key, Client: client.New(r.URL, keyB.Key)}

	// Volumes on one shared database: the volume lives on one node.
	vol := viaB.newVolume(t, "data", 8)
	if rr := viaB.content(t, vol, "PUT", "file?path=/hello.txt", "team b's"); rr.Status != http.StatusCreated {
		t.Fatalf("content PUT through the router: %d %s", rr.Status, rr.Body)
	}
	missing := via.do(t, "GET", "/volumes/00000000-0000-4000-8000-000000000000", key, nil, nil)
	other := via.do(t, "GET", "/volumes/"+vol.VolumeID, key, nil, nil)
	if missing.Status != http.StatusNotFound || other.Status != missing.Status ||
		strings.ReplaceAll(string(other.Body), vol.VolumeID, "ID") != strings.ReplaceAll(string(missing.Body), "00000000-0000-4000-8000-000000000000", "ID") {
		t.Errorf("another team's volume = %d %s, a missing one = %d %s: want the same", other.Status, other.Body, missing.Status, missing.Body)
	}
	var defaults []api.Volume
	if rr := via.do(t, "GET", "/volumes", key, nil, nil); rr.Status != 200 || json.Unmarshal(rr.Body, &defaults) != nil || len(defaults) != 0 {
		t.Errorf("the default team's volumes: %d %s, want none", rr.Status, rr.Body)
	}
	// Sandboxes the test kills itself (their nodes stop theirs at cleanup):
	// node-b is killed at the end.
	create := func(c *client.Client, req api.NewSandbox) *client.Sandbox {
		t.Helper()
		req.TemplateID = "minimal"
		sb, err := c.Create(ctxT(t), req)
		if err != nil {
			t.Fatalf("create through the router: %v", err)
		}
		return sb
	}
	sbB := create(viaB.Client, api.NewSandbox{VolumeMounts: []api.VolumeMount{{Name: "data", Path: "/data"}}})
	if got := rsh(t, sbB.Envd(), `cat /data/hello.txt`); got != "team b's" {
		t.Errorf("the volume's file in team b's sandbox: %q", got)
	}

	// A sandbox of the default team on each node.
	onNode := map[string]string{}
	var order []string // of creation
	for i := 0; i < 30 && len(onNode) < 2; i++ {
		sb := create(via.Client, api.NewSandbox{})
		if n := byTag[sb.ID()[:cluster.TagLen]]; onNode[n] == "" {
			onNode[n] = sb.ID()
			order = append(order, sb.ID())
		} else if err := via.Client.Kill(ctxT(t), sb.ID()); err != nil {
			t.Fatal(err)
		}
	}
	if len(onNode) != 2 {
		t.Fatalf("no sandbox on each node in 30 creates: %v", onNode)
	}

	// /mcp: the router's tools see the whole cluster, a team's its own.
	listed := func(key string) string {
		cl := sdk.NewClient(&sdk.Implementation{Name: "fence-test-router", Version: "1"}, nil)
		cs, err := cl.Connect(ctxT(t), &sdk.StreamableClientTransport{Endpoint: r.URL + "/mcp",
			HTTPClient: &http.Client{Transport: keyTransport{key: key, base: http.DefaultTransport}}, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatalf("/mcp through the router: %v", err)
		}
		defer cs.Close()
		var out mcp.ListOutput
		mcpMust(t, cs, "list_sandboxes", map[string]any{}, &out)
		var ids []string
		for _, s := range out.Sandboxes {
			ids = append(ids, s.SandboxID)
		}
		var run mcp.RunOutput
		mcpMust(t, cs, "run_command", map[string]any{"sandbox_id": ids[0], "command": "echo through-the-router"}, &run)
		if run.Stdout != "through-the-router\n" {
			t.Errorf("run_command through the router's /mcp: %+v", run)
		}
		return strings.Join(ids, " ")
	}
	if got := listed(key); !strings.Contains(got, onNode["node-a"]) || !strings.Contains(got, onNode["node-b"]) || strings.Contains(got, sbB.ID()) {
		t.Errorf("list_sandboxes through the router: %s, want %v", got, onNode)
	}
	if got := listed(keyB.Key); got != sbB.ID() {
		t.Errorf("team b's list_sandboxes through the router: %s, want %s alone", got, sbB.ID())
	}

	for _, id := range onNode {
		if err := via.Client.Kill(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := viaB.Client.Kill(ctxT(t), sbB.ID()); err != nil {
		t.Fatal(err)
	}

	// /audit: both nodes' records, merged by time.
	audit := func(key, query string) ([]routedRecord, rawResponse) {
		rr := via.do(t, "GET", "/audit?"+query, key, nil, nil)
		var recs []routedRecord
		if rr.Status != 200 || json.Unmarshal(rr.Body, &recs) != nil {
			t.Fatalf("GET /audit?%s through the router = %d %s", query, rr.Status, rr.Body)
		}
		return recs, rr
	}
	const types = "type=sandbox.create,sandbox.kill"
	var all []routedRecord
	eventually(t, 30*time.Second, "the kill record of every sandbox", func() bool {
		all, _ = audit(key, types)
		alive := map[string]bool{}
		for _, rec := range all {
			alive[rec.Sandbox] = rec.Type == "sandbox.create"
		}
		return len(alive) >= 3 && !slices.Contains(slices.Collect(maps.Values(alive)), true)
	})
	created := map[string]int{}
	for i, rec := range all {
		if rec.Node != "node-a" && rec.Node != "node-b" {
			t.Fatalf("record %d names node %q", i, rec.Node)
		}
		if rec.Type == "sandbox.create" {
			created[rec.Sandbox] = i
			if want := byTag[rec.Sandbox[:cluster.TagLen]]; rec.Node != want {
				t.Errorf("the create of %s says node %s, want %s", rec.Sandbox, rec.Node, want)
			}
		}
		if i > 0 && all[i-1].Node != rec.Node && all[i-1].Time.After(rec.Time) {
			t.Errorf("records %d (%s %s) and %d (%s %s) are out of time order", i-1, all[i-1].Node, all[i-1].Time, i, rec.Node, rec.Time)
		}
	}
	i0, ok0 := created[order[0]]
	i1, ok1 := created[order[1]]
	if _, okB := created[sbB.ID()]; !ok0 || !ok1 || !okB {
		t.Fatalf("creates through the router: %v, want those of %v and %s", created, order, sbB.ID())
	}
	if i0 > i1 {
		t.Errorf("the create of %s (made first) comes after that of %s", order[0], order[1])
	}

	// Pages of 2 that follow the cursor give the same records.
	var paged []routedRecord
	after := ""
	for range 100 {
		page, rr := audit(key, types+"&limit=2&after="+after)
		if len(page) == 0 {
			break
		}
		if len(page) > 2 {
			t.Fatalf("a page of limit 2 holds %d", len(page))
		}
		paged = append(paged, page...)
		after = rr.Header.Get(api.HeaderAuditCursor)
	}
	if len(paged) != len(all) || !slices.EqualFunc(paged, all, func(a, b routedRecord) bool { return a.Node == b.Node && a.Seq == b.Seq }) {
		t.Errorf("paged through the cursor: %d records, unpaged %d, or in another order", len(paged), len(all))
	}

	// Team b's key reads team b's records alone.
	mine, _ := audit(keyB.Key, "")
	if len(mine) == 0 {
		t.Fatal("team b reads no audit record through the router")
	}
	for _, rec := range mine {
		if rec.Sandbox == onNode["node-a"] || rec.Sandbox == onNode["node-b"] || (rec.Sandbox == "" && !strings.Contains(rec.Actor, teamB.TeamID)) {
			t.Errorf("team b reads a record not its own: %+v", rec)
		}
	}

	// /audit/stream: the backlog of both nodes in one stream.
	streamed := auditStreamed(t, r.URL, key, "type=sandbox.create", []string{onNode["node-a"], onNode["node-b"]})
	if !strings.Contains(streamed, "node-a:") || !strings.Contains(streamed, "node-b:") {
		t.Errorf("the last event id of the stream: %q, want a cursor of both nodes", streamed)
	}

	// /audit/verify: every node's trail; the operator's alone.
	var ver struct {
		Intact bool                       `json:"intact"`
		Nodes  map[string]json.RawMessage `json:"nodes"`
	}
	if rr := via.do(t, "GET", "/audit/verify", key, nil, nil); rr.Status != 200 || json.Unmarshal(rr.Body, &ver) != nil || !ver.Intact || len(ver.Nodes) != 2 {
		t.Errorf("GET /audit/verify through the router = %d %s", rr.Status, rr.Body)
	}
	if rr := via.do(t, "GET", "/audit/verify", keyB.Key, nil, nil); rr.Status == 200 {
		t.Errorf("GET /audit/verify with team b's key = %d %s, want refused", rr.Status, rr.Body)
	}

	// /usage: the nodes' answers summed.
	type usageReport struct {
		Sandboxes []struct {
			ID string `json:"sandbox_id"`
		} `json:"sandboxes"`
		Keys []struct {
			Actor     string  `json:"actor"`
			Sandboxes int     `json:"sandboxes"`
			CPU       float64 `json:"cpu_seconds"`
			Running   float64 `json:"running_seconds"`
		} `json:"keys"`
	}
	var routed usageReport
	if rr := via.do(t, "GET", "/usage", key, nil, nil); rr.Status != 200 || json.Unmarshal(rr.Body, &routed) != nil || rr.Header.Get(api.HeaderUnansweredNodes) != "" {
		t.Fatalf("GET /usage through the router = %d %s", rr.Status, rr.Body)
	}
	wantCount := map[string]int{}
	wantCPU := map[string]float64{}
	sandboxes := 0
	for name, d := range nodes {
		var rep usageReport
		if rr := d.do(t, "GET", "/usage", key, nil, map[string]string{cluster.HeaderToken: token}); rr.Status != 200 || json.Unmarshal(rr.Body, &rep) != nil {
			t.Fatalf("GET /usage on %s = %d %s", name, rr.Status, rr.Body)
		}
		sandboxes += len(rep.Sandboxes)
		for _, k := range rep.Keys {
			wantCount[k.Actor] += k.Sandboxes
			wantCPU[k.Actor] += k.CPU
		}
	}
	if len(routed.Sandboxes) != sandboxes || len(routed.Keys) != len(wantCount) {
		t.Errorf("usage through the router: %d sandboxes, %d keys; the nodes' %d and %d", len(routed.Sandboxes), len(routed.Keys), sandboxes, len(wantCount))
	}
	for _, k := range routed.Keys {
		if k.Sandboxes != wantCount[k.Actor] || math.Abs(k.CPU-wantCPU[k.Actor]) > 1e-9 {
			t.Errorf("usage of %s through the router: %d sandboxes, %v s of CPU; the nodes' sum %d, %v", k.Actor, k.Sandboxes, k.CPU, wantCount[k.Actor], wantCPU[k.Actor])
		}
	}
	var routedB usageReport
	if rr := via.do(t, "GET", "/usage", keyB.Key, nil, nil); rr.Status != 200 || json.Unmarshal(rr.Body, &routedB) != nil ||
		len(routedB.Sandboxes) != 1 || routedB.Sandboxes[0].ID != sbB.ID() {
		t.Errorf("team b's usage through the router = %d %s, want its sandbox alone", rr.Status, rr.Body)
	}

	if rr := viaB.do(t, "DELETE", "/volumes/"+vol.VolumeID, keyB.Key, nil, nil); rr.Status != http.StatusNoContent {
		t.Errorf("DELETE of team b's volume through the router = %d %s", rr.Status, rr.Body)
	}

	// A node killed, its Lease not yet expired: named, not left out.
	nodes["node-b"].Crash()
	for _, path := range []string{"/audit?" + types, "/usage"} {
		rr := via.do(t, "GET", path, key, nil, nil)
		_, live, _ := r.health() // after: a dead node's Lease only expires
		if rr.Status != 200 || (live == 2 && rr.Header.Get(api.HeaderUnansweredNodes) != "node-b") {
			t.Errorf("GET %s with node-b killed = %d, %s %q (router sees %d nodes)", path, rr.Status,
				api.HeaderUnansweredNodes, rr.Header.Get(api.HeaderUnansweredNodes), live)
		}
	}
}

// auditStreamed reads GET /audit/stream?query through the router until
// it has seen a record of every sandbox of ids; it returns the last
// event id.
func auditStreamed(t *testing.T, url, key, query string, ids []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/audit/stream?"+query, nil)
	req.Header.Set(api.HeaderAPIKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /audit/stream through the router = %d", resp.StatusCode)
	}
	seen := map[string]bool{}
	last := ""
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for len(seen) < len(ids) && sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			last = v
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			var rec routedRecord
			if json.Unmarshal([]byte(v), &rec) == nil && slices.Contains(ids, rec.Sandbox) {
				seen[rec.Sandbox] = true
			}
		}
	}
	if len(seen) < len(ids) {
		t.Errorf("the stream through the router ended (%v) having seen %v of %v", sc.Err(), seen, ids)
	}
	return last
}
