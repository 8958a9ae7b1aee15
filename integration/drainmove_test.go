package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestScaleoutDrainMoves runs two nodes with --drain-moves on one
// PostgreSQL database and one registry behind a router: the sandboxes of
// the node the operator drains (one paused without memory, one running,
// and on gvisor one with a running process) are paused into the
// registry, and their next connect through the router takes each over on
// the other node under the same ID, its files (and on gvisor its
// processes) intact. Its Bench step times a resume on the same
// node (a filesystem-only pause) against one on another node (the move).
func TestScaleoutDrainMoves(t *testing.T) {
	testutil.RequireRoot(t)
	k, _, key := startCluster(t)
	dsn := pgtest.New(t).Database(t)
	sealing := clusterKey(t)
	reg := startRegistry(t)
	nodes := map[string]*daemon{}
	byTag := map[string]string{}
	for _, n := range []string{"node-a", "node-b"} {
		nodes[n] = startNode(t, k, n, key, "--database", dsn, "--secrets-key", sealing, "--registry", reg.URL, "--drain-moves")
		byTag[cluster.Tag(n)] = n
	}
	r := startRouter(t, k, key, 0, "--shared-database")
	eventually(t, 30*time.Second, "router sees 2 placeable nodes", func() bool {
		st, live, pl := r.health()
		return st == 200 && live == 2 && pl == 2
	})
	rc := client.New(r.URL, key)
	sb, err := rc.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatalf("create through the router: %v", err)
	}
	id := sb.ID()
	t.Cleanup(func() { rc.Kill(ctxT(t), id) })
	from := byTag[id[:cluster.TagLen]]
	to := map[string]string{"node-a": "node-b", "node-b": "node-a"}[from]
	sh(t, sb.Envd(), `set -e; mkdir -p /home/user/work; echo "before the drain" > /home/user/work/note
		dd if=/dev/urandom of=/home/user/work/blob bs=1k count=512 2>/dev/null; sha256sum /home/user/work/blob > /home/user/work/blob.sum`)

	// Bench: a resume on the same node, from a filesystem-only pause.
	if err := rc.PauseWithoutMemory(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if _, err := rc.Connect(ctxT(t), id, 5*time.Minute); err != nil {
		t.Fatalf("connect after a pause on the same node: %v", err)
	}
	same := time.Since(t0)

	// onFrom creates sandboxes through the router until one is placed on
	// the node to drain.
	onFrom := func(req api.NewSandbox) *client.Sandbox {
		t.Helper()
		for range 20 {
			s, err := rc.Create(ctxT(t), req)
			if err != nil {
				t.Fatalf("create through the router: %v", err)
			}
			if byTag[s.ID()[:cluster.TagLen]] == from {
				t.Cleanup(func() { rc.Kill(ctxT(t), s.ID()) })
				return s
			}
			rc.Kill(ctxT(t), s.ID())
		}
		t.Fatalf("no sandbox was placed on %s in 20 creates", from)
		return nil
	}
	// The first sandbox is paused without memory when the node is
	// drained (it moves as it is), a second one runs (it is paused to move).
	if err := rc.PauseWithoutMemory(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	running := onFrom(api.NewSandbox{TemplateID: "minimal"})
	sh(t, running.Envd(), `echo "running at the drain" > /home/user/state`)

	// On gvisor the move keeps memory and processes: a counting loop
	// started before the drain goes on after.
	var gv *client.Sandbox
	c0 := 0
	if haveRunsc(t) {
		requireTemplate(t, "base")
		gv = onFrom(api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta})
		sh(t, gv.Envd(), `(i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done) </dev/null >/dev/null 2>&1 &`)
		eventually(t, 30*time.Second, "the gvisor loop to count", func() bool { c0 = countOf(t, gv.Envd()); return c0 > 3 })
	}

	setDrain(t, k, from, true)
	eventually(t, 60*time.Second, "the drained node moves its sandboxes to the registry", func() bool {
		return strings.Contains(nodes[from].out.String(), "node drained: sandboxes moved to the registry")
	})
	if !strings.Contains(nodes[from].out.String(), "stayed=0") {
		t.Fatalf("a sandbox of the drained node stayed:\n%s", tail(nodes[from].out.String(), 3000))
	}
	// Any node tells where it is: in the registry, waiting.
	st, b, err := httpDo("GET", nodes[to].URL+"/moved-sandboxes/"+id, nil, map[string]string{"X-API-Key": key, cluster.HeaderToken: os.Getenv("FENCE_CLUSTER_TOKEN")})
	if err != nil || st != http.StatusOK || !strings.Contains(string(b), `"waiting":true`) {
		t.Fatalf("GET /moved-sandboxes/%s on %s = %d %s %v", id, to, st, b, err)
	}
	// Another team sees a moved sandbox exactly as a missing one.
	hdr := map[string]string{"X-API-Key": key, "Content-Type": "application/json"}
	var team api.TeamInfo
	if st, b, err := httpDo("POST", r.URL+"/admin/teams", []byte(`{"name":"team-b"}`), hdr); err != nil || st != http.StatusCreated || json.Unmarshal(b, &team) != nil {
		t.Fatalf("POST /admin/teams = %d %s %v", st, b, err)
	}
	var keyB api.CreatedTeamAPIKey
	if st, b, err := httpDo("POST", r.URL+"/admin/teams/"+team.TeamID+"/api-keys", []byte(`{"name":"b"}`), hdr); err != nil || st != http.StatusCreated || json.Unmarshal(b, &keyB) != nil {
		t.Fatalf("POST /admin/teams/%s/api-keys = %d %s %v", team.TeamID, st, b, err)
	}
	noSuch := id[:cluster.TagLen] + strings.Repeat("0", len(id)-cluster.TagLen)
	for _, p := range []struct{ method, path string }{{"POST", "/v2/sandboxes/ID/connect"}, {"POST", "/sandboxes/ID/resume"}, {"GET", "/moved-sandboxes/ID"}} {
		var answers [2]string
		for i, x := range []string{id, noSuch} {
			st, b, err := httpDo(p.method, r.URL+strings.ReplaceAll(p.path, "ID", x), []byte(`{}`), map[string]string{"X-API-Key": keyB.Key, "Content-Type": "application/json"})
			if err != nil {
				t.Fatal(err)
			}
			answers[i] = fmt.Sprintf("%d %s", st, strings.ReplaceAll(string(b), x, "ID"))
		}
		if answers[0] != answers[1] || !strings.HasPrefix(answers[0], "404 ") {
			t.Errorf("%s %s by another team: %q for the moved sandbox, %q for none", p.method, p.path, answers[0], answers[1])
		}
	}
	t0 = time.Now()
	moved, err := rc.Connect(ctxT(t), id, 5*time.Minute)
	if err != nil {
		t.Fatalf("connect through the router to the moved sandbox: %v", err)
	}
	other := time.Since(t0)
	if moved.ID() != id {
		t.Fatalf("the moved sandbox came back as %s, want %s", moved.ID(), id)
	}
	if !strings.Contains(nodes[to].out.String(), "sandbox moved here from the registry\" sandbox_id="+id) {
		t.Fatalf("%s did not take sandbox %s over:\n%s", to, id, tail(nodes[to].out.String(), 3000))
	}
	got := sh(t, moved.Envd(), `cat /home/user/work/note; cd /home/user/work && sha256sum -c blob.sum`)
	if want := "before the drain\n/home/user/work/blob: OK\n"; got != want {
		t.Fatalf("the moved sandbox sees %q, want %q", got, want)
	}
	// Its control plane follows it too.
	if info, err := rc.Get(ctxT(t), id); err != nil || info.State != "running" {
		t.Fatalf("GET of the moved sandbox through the router = %+v, %v", info, err)
	}
	back, err := rc.Connect(ctxT(t), running.ID(), 5*time.Minute)
	if err != nil {
		t.Fatalf("connect to the moved running sandbox: %v", err)
	}
	if got := sh(t, back.Envd(), `cat /home/user/state`); got != "running at the drain\n" {
		t.Fatalf("the sandbox running at the drain sees %q after its move", got)
	}
	if gv != nil {
		back, err := rc.Connect(ctxT(t), gv.ID(), 5*time.Minute)
		if err != nil {
			t.Fatalf("connect to the moved gvisor sandbox: %v", err)
		}
		goesOnCounting(t, back, c0, "the moved gvisor sandbox")
	}
	load, _ := exec.Command("uptime").Output()
	t.Logf("BENCH resume on the same node %v, on another node (pull and boot) %v: %.1fx; load: %s", same.Round(time.Millisecond),
		other.Round(time.Millisecond), float64(other)/float64(same), strings.TrimSpace(string(load)))
}

// goesOnCounting checks that the counting loop of sb (countOf) went on
// from at least from: its process was restored, not started again.
func goesOnCounting(t *testing.T, sb *client.Sandbox, from int, what string) {
	t.Helper()
	c := countOf(t, sb.Envd())
	if c < from {
		t.Errorf("%s: counter %d, below %d before the move: the loop did not go on", what, c, from)
	}
	eventually(t, 30*time.Second, what+": the counter to advance", func() bool { return countOf(t, sb.Envd()) > c })
}

// haveRunsc reports whether runsc is here; in CI it must be.
func haveRunsc(t *testing.T) bool {
	p := cmpOr(os.Getenv("FENCE_RUNSC"), "/var/lib/fence/cache/runsc/runsc")
	if _, err := os.Stat(p); err != nil {
		if testutil.InCI() {
			t.Fatalf("runsc: %v", err)
		}
		return false
	}
	return true
}
