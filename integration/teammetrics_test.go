package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// secondTeam makes a team "team-b" and an API key of it in dataDir's
// store, before a daemon opens it.
func secondTeam(t *testing.T, dataDir string) (teamID, key string) {
	t.Helper()
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(ctxT(t), filepath.Join(dataDir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	team, err := db.CreateTeam(ctxT(t), "team-b")
	if err != nil {
		t.Fatal(err)
	}
	key, _, err = db.MintAPIKey(ctxT(t), team.ID, "metrics")
	if err != nil {
		t.Fatal(err)
	}
	return team.ID, key
}

// TestTeamMetrics: E2B's team metrics and their maximum count each
// team's own sandboxes and starts; another team's ID (or an unknown
// one) is E2B's 403; bad ranges are 400; /usage?team= is the admin's
// across teams and a team's own alone; the Prometheus series are
// labelled by team, never by sandbox. Root: namespaces.
func TestTeamMetrics(t *testing.T) {
	requireTemplate(t, "minimal")
	dataDir := newDataDir(t)
	teamB, keyB := secondTeam(t, dataDir)
	d := startDaemon(t, dataDir)
	teamA, keyA := tenancy.DefaultTeamID, d.Key
	d.create(t, api.NewSandbox{})
	d.create(t, api.NewSandbox{})
	r := d.do(t, "POST", "/sandboxes", keyB, strings.NewReader(`{"templateID":"minimal","timeout":300}`), nil)
	var sbB api.Sandbox
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &sbB) != nil {
		t.Fatalf("team b's create = %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() { d.do(t, "DELETE", "/sandboxes/"+sbB.SandboxID, keyB, nil, nil) })

	metricMax := func(key, team, metric string) float64 {
		t.Helper()
		r := d.do(t, "GET", "/teams/"+team+"/metrics/max?metric="+metric, key, nil, nil)
		var m struct {
			TimestampUnix int64   `json:"timestampUnix"`
			Value         float64 `json:"value"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &m) != nil || m.TimestampUnix == 0 {
			t.Fatalf("GET metrics/max %s of %s = %d %s", metric, team, r.Status, r.Body)
		}
		return m.Value
	}
	for _, c := range []struct {
		key, team string
		running   float64
	}{{keyA, teamA, 2}, {keyB, teamB, 1}, {keyA, teamB, 1}} {
		if got := metricMax(c.key, c.team, "concurrent_sandboxes"); got != c.running {
			t.Errorf("max concurrent sandboxes of %s = %v, want %v", c.team, got, c.running)
		}
		if got := metricMax(c.key, c.team, "sandbox_start_rate"); got <= 0 {
			t.Errorf("max start rate of %s = %v, want some", c.team, got)
		}
		var ms []tenancy.TeamMetric
		r := d.do(t, "GET", "/teams/"+c.team+"/metrics", c.key, nil, nil)
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &ms) != nil || len(ms) == 0 {
			t.Fatalf("GET metrics of %s = %d %.300s", c.team, r.Status, r.Body)
		}
		if last := ms[len(ms)-1]; float64(last.ConcurrentSandboxes) != c.running || last.TimestampUnix != last.Timestamp.Unix() {
			t.Errorf("last step of %s: %+v, want %v running", c.team, last, c.running)
		}
	}
	unknown := "00000000-0000-4000-8000-00000000beef"
	for _, team := range []string{teamA, unknown, "not-a-uuid"} {
		for _, p := range []string{"/metrics", "/metrics/max?metric=concurrent_sandboxes"} {
			wantE2BError(t, d.do(t, "GET", "/teams/"+team+p, keyB, nil, nil), http.StatusForbidden,
				fmt.Sprintf("You (%s) are not authorized to access this team's (%s) metrics", teamB, team))
		}
	}
	wantE2BError(t, d.do(t, "GET", "/teams/"+unknown+"/metrics", keyA, nil, nil), http.StatusNotFound, "Team not found")
	for _, q := range []string{"?start=20&end=10", "?end=99999999999", "?start=-1", "?start=x"} {
		wantE2BError(t, d.do(t, "GET", "/teams/"+teamB+"/metrics"+q, keyB, nil, nil), http.StatusBadRequest, "")
	}
	wantE2BError(t, d.do(t, "GET", "/teams/"+teamB+"/metrics/max?metric=bogus", keyB, nil, nil), http.StatusBadRequest, "metric")
	wantE2BError(t, d.do(t, "GET", "/teams/"+teamB+"/metrics/max", keyB, nil, nil), http.StatusBadRequest, "metric")
	// A range before anything happened: no steps, and a maximum of 0.
	if r := d.do(t, "GET", "/teams/"+teamB+"/metrics?start=0&end=1000", keyB, nil, nil); r.Status != 200 || strings.TrimSpace(string(r.Body)) != "[]" {
		t.Errorf("metrics of 1970 = %d %s, want []", r.Status, r.Body)
	}

	// /usage?team=.
	usageOf := func(key, q string) (int, []string) {
		t.Helper()
		r := d.do(t, "GET", "/usage"+q, key, nil, nil)
		var rep struct {
			Sandboxes []struct {
				ID string `json:"sandbox_id"`
			} `json:"sandboxes"`
		}
		if r.Status == http.StatusOK && json.Unmarshal(r.Body, &rep) != nil {
			t.Fatalf("GET /usage%s: %s", q, r.Body)
		}
		var ids []string
		for _, s := range rep.Sandboxes {
			ids = append(ids, s.ID)
		}
		return r.Status, ids
	}
	if st, ids := usageOf(keyA, "?team="+teamB); st != 200 || len(ids) != 1 || ids[0] != sbB.SandboxID {
		t.Errorf("the admin's /usage?team=b = %d %v, want b's sandbox alone", st, ids)
	}
	if st, ids := usageOf(keyA, "?team="+teamA); st != 200 || len(ids) != 2 {
		t.Errorf("the admin's /usage?team=default = %d %v, want its 2 sandboxes", st, ids)
	}
	if st, ids := usageOf(keyB, "?team="+teamB); st != 200 || len(ids) != 1 {
		t.Errorf("team b's /usage?team=b = %d %v", st, ids)
	}
	for _, team := range []string{teamA, unknown} {
		wantE2BError(t, d.do(t, "GET", "/usage?team="+team, keyB, nil, nil), http.StatusNotFound, "Team not found")
	}
	wantE2BError(t, d.do(t, "GET", "/usage?team="+unknown, keyA, nil, nil), http.StatusNotFound, "Team not found")

	// Prometheus: a series per team, none per sandbox.
	r = d.do(t, "GET", "/metrics", keyA, nil, nil)
	body := string(r.Body)
	for _, want := range []string{
		`fence_team_sandboxes_running{team="` + teamA + `"} 2`,
		`fence_team_sandboxes_running{team="` + teamB + `"} 1`,
		`fence_team_sandbox_starts_total{team="` + teamB + `"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /metrics has no %q", want)
		}
	}
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "fence_team_") && strings.Contains(l, sbB.SandboxID) {
			t.Errorf("a team series names a sandbox: %s", l)
		}
	}
}
