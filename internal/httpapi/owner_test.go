package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/audit"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/downloads"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// teamsEnv is a daemon's API with two teams' keys: team-a's and
// team-b's, and a key of the default team that is not the bootstrap one.
type teamsEnv struct {
	*testEnv
	keys      map[string]string // by the tests' team name
	approvals *approvals.Queue
}

// newTeamsEnv is newTestEnv with secrets checked at create, and teams.
func newTeamsEnv(t *testing.T) *teamsEnv {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	sec, err := secrets.Open(secrets.Options{DB: st, KeyPath: filepath.Join(t.TempDir(), "secrets.key")})
	if err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	nets := fences.New(fences.Options{Logger: log, Secrets: sec})
	m, err := sandbox.New(sandbox.Options{Network: nets, Backend: fake.New(fake.Options{Host: host, StreamInterval: time.Millisecond}),
		Store: st, Templates: templates{"base": "/rootfs/base"}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	dl, err := downloads.Open(t.Context(), st, downloads.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, team := range []string{"team-a", "team-b", "default"} {
		id := tenancy.DefaultTeamID
		if team != "default" {
			tm, err := st.CreateTeam(t.Context(), team)
			if err != nil {
				t.Fatal(err)
			}
			id = tm.ID
		}
		if keys[team], _, err = st.MintAPIKey(t.Context(), id, "key of "+team); err != nil {
			t.Fatal(err)
		}
	}
	q := approvals.New(approvals.Options{})
	srv := httptest.NewServer(New(Options{Manager: m, Network: nets, APIKey: testKey, Domain: "fence.test", Logger: log,
		Secrets: sec, Downloads: dl, Usage: m.Meter(), Identity: st, Approvals: q}))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background())
		host.Close()
		st.Close()
	})
	return &teamsEnv{&testEnv{srv: srv, m: m, net: nets, host: host, st: st, sec: sec, dl: dl}, keys, q}
}

// as sends a request with team's API key.
func (e *teamsEnv) as(t *testing.T, team, method, path, body string) (int, string) {
	t.Helper()
	resp, b := e.do(t, method, path, body, "X-API-Key: "+e.keys[team])
	return resp.StatusCode, string(b)
}

// TestOtherTeamsObjectsAreMissing sends every route naming a sandbox or
// a secret with another team's IDs and with IDs that never existed: the
// answers are the same 404 (the ID aside), lists leave the other team's
// objects out, and the objects are unchanged afterwards.
func TestOtherTeamsObjectsAreMissing(t *testing.T) {
	e := newTeamsEnv(t)
	const teamA, teamB = "team-a", "team-b"
	code, body := e.as(t, teamA, "POST", "/secrets", `{"name":"tok","value":"s3cret-value-of-a"}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /secrets (a) = %d %s", code, body)
	}
	secA := decodeSecret(t, []byte(body))
	code, body = e.as(t, teamA, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300,
		"secrets":{"TOK":{"secret":"tok","hosts":["api.example.com"]}}}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /v2/sandboxes (a) = %d %s", code, body)
	}
	var sbA api.Sandbox
	if err := json.Unmarshal([]byte(body), &sbA); err != nil {
		t.Fatal(err)
	}
	_, before := e.as(t, teamA, "GET", "/sandboxes/"+sbA.SandboxID, "")

	const missingSandbox = "zzzzzzzzzzzzzzzzzzzz"
	sandboxRoutes := []struct{ method, path, body string }{
		{"GET", "/sandboxes/{id}", ""},
		{"DELETE", "/sandboxes/{id}", ""},
		{"POST", "/sandboxes/{id}/timeout", `{"timeout":3600}`},
		{"POST", "/sandboxes/{id}/pause", ""},
		{"POST", "/sandboxes/{id}/resume", `{"timeout":60}`},
		{"POST", "/sandboxes/{id}/connect", `{"timeout":60}`},
		{"POST", "/v2/sandboxes/{id}/connect", `{"timeout":60}`},
		{"POST", "/sandboxes/{id}/refreshes", `{"duration":60}`},
		{"GET", "/sandboxes/{id}/metrics", ""},
		{"GET", "/sandboxes/{id}/downloads", ""},
		{"GET", "/sandboxes/{id}/logs", ""},
		{"GET", "/v2/sandboxes/{id}/logs", ""},
		{"GET", "/sandboxes/{id}/export", ""},
		{"POST", "/sandboxes/{id}/fork", `{"count":1}`},
		{"POST", "/sandboxes/{id}/snapshots", `{}`},
		{"POST", "/sandboxes/{id}/checkpoints", `{}`},
		{"GET", "/sandboxes/{id}/checkpoints", ""},
		{"POST", "/sandboxes/{id}/rewind", `{"checkpointID":"cp1"}`},
		{"GET", "/sandboxes/{id}/diff", ""},
		{"PUT", "/sandboxes/{id}/network", `{"allowOut":["example.com"],"denyOut":["ALL_TRAFFIC"]}`},
	}
	for _, r := range sandboxRoutes {
		sameAsMissing(t, e, teamB, r.method, r.path, r.body, sbA.SandboxID, missingSandbox)
	}
	const missingSecret = "sec_0aaaaaaaaaaaaaaaaaaaaaaaaa"
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/secrets/{id}", ""},
		{"POST", "/secrets/{id}", `{"value":"overwritten"}`},
		{"DELETE", "/secrets/{id}", ""},
	} {
		sameAsMissing(t, e, teamB, r.method, r.path, r.body, secA.SecretID, missingSecret)
	}
	// By name: team-b has no secret "tok" until it makes its own.
	sameAsMissing(t, e, teamB, "GET", "/secrets/{id}", "", "tok", "nosuchname")
	bind := func(name string) (int, string) {
		return e.as(t, teamB, "POST", "/v2/sandboxes", `{"templateID":"base","secrets":{"TOK":{"secret":"`+name+`","hosts":["api.example.com"]}}}`)
	}
	for _, sel := range []string{"tok", secA.SecretID} {
		code, body := bind(sel)
		mcode, mbody := bind(strings.Replace(sel, "tok", "nosuchname", 1))
		if code != http.StatusBadRequest || code != mcode || strings.ReplaceAll(body, sel, "X") != strings.ReplaceAll(strings.ReplaceAll(mbody, "nosuchname", "tok"), sel, "X") {
			t.Errorf("team-b binding team-a's secret %s = %d %s; a missing one = %d %s", sel, code, body, mcode, mbody)
		}
	}
	if code, body := e.as(t, teamB, "POST", "/secrets", `{"name":"tok","value":"b-value"}`); code != http.StatusCreated {
		t.Errorf("team-b's own secret named as team-a's = %d %s, want 201", code, body)
	}

	// Lists leave team-a's objects out.
	for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running,paused", "/sandboxes/metrics?sandbox_ids=" + sbA.SandboxID} {
		if code, body := e.as(t, teamB, "GET", path, ""); code != http.StatusOK || strings.Contains(body, sbA.SandboxID) {
			t.Errorf("GET %s (team-b) = %d %s: lists team-a's sandbox", path, code, body)
		}
	}
	if code, body := e.as(t, teamB, "GET", "/secrets", ""); code != http.StatusOK || strings.Contains(body, secA.SecretID) {
		t.Errorf("GET /secrets (team-b) = %d %s: lists team-a's secret", code, body)
	}
	if code, body := e.as(t, teamA, "GET", "/v2/sandboxes", ""); code != http.StatusOK || !strings.Contains(body, sbA.SandboxID) {
		t.Errorf("GET /v2/sandboxes (team-a) = %d %s: misses its own sandbox", code, body)
	}

	// Usage: a team's own sandboxes and keys; another team's sandbox is
	// left out as a missing one is.
	for _, path := range []string{"/usage", "/usage?sandbox=" + sbA.SandboxID} {
		code, body := e.as(t, teamB, "GET", path, "")
		if code != http.StatusOK || strings.Contains(body, sbA.SandboxID) || strings.Contains(body, `"actor":"team:`) {
			t.Errorf("GET %s (team-b) = %d %s: shows team-a's usage", path, code, body)
		}
	}
	if code, body := e.as(t, teamA, "GET", "/usage", ""); code != http.StatusOK || !strings.Contains(body, sbA.SandboxID) {
		t.Errorf("GET /usage (team-a) = %d %s: misses its own sandbox", code, body)
	}
	if resp, body := e.api(t, "GET", "/usage", ""); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), sbA.SandboxID) {
		t.Errorf("GET /usage (bootstrap key) = %d %s", resp.StatusCode, body)
	}

	// Nothing of team-a's changed.
	if code, after := e.as(t, teamA, "GET", "/sandboxes/"+sbA.SandboxID, ""); code != http.StatusOK || after != before {
		t.Errorf("team-a's sandbox after team-b's requests = %d %s, want %s", code, after, before)
	}
	code, body = e.as(t, teamA, "GET", "/secrets/"+secA.SecretID, "")
	if code != http.StatusOK || decodeSecret(t, []byte(body)).CurrentVersion != 1 {
		t.Errorf("team-a's secret after team-b's requests = %d %s, want version 1", code, body)
	}
	if v, err := e.sec.Value(t.Context(), secA.SecretID); err != nil || v != "s3cret-value-of-a" {
		t.Errorf("team-a's secret value = %q, %v", v, err)
	}
}

// sameAsMissing checks that team's request on route (its {id} replaced by
// other, another team's object) answers 404 exactly as with missing, an
// ID that never existed.
func sameAsMissing(t *testing.T, e *teamsEnv, team, method, route, body, other, missing string) {
	t.Helper()
	code, got := e.as(t, team, method, strings.Replace(route, "{id}", other, 1), body)
	mcode, want := e.as(t, team, method, strings.Replace(route, "{id}", missing, 1), body)
	got = strings.ReplaceAll(got, other, "ID")
	want = strings.ReplaceAll(want, missing, "ID")
	if code != http.StatusNotFound || code != mcode || got != want {
		t.Errorf("%s %s with another team's ID = %d %s; with a missing one = %d %s; want the same 404", method, route, code, got, mcode, want)
	}
}

// TestAuditOfOtherTeamsIsMissing: a team reads the audit records its
// requests and its sandboxes caused, in GET /audit and in the backlog and
// live records of /audit/stream, and none of another team's or the
// daemon's own; the bootstrap key reads them all.
func TestAuditOfOtherTeamsIsMissing(t *testing.T) {
	e, al := newAuditEnv(t)
	key, id := map[string]string{}, map[string]string{}
	for _, team := range []string{"a", "b"} {
		tm, err := e.st.CreateTeam(t.Context(), "team-"+team)
		if err != nil {
			t.Fatal(err)
		}
		if key[team], _, err = e.st.MintAPIKey(t.Context(), tm.ID, "k"); err != nil {
			t.Fatal(err)
		}
		resp, b := e.do(t, "POST", "/v2/sandboxes", `{"templateID":"base"}`, "X-API-Key: "+key[team])
		var s api.Sandbox
		if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &s) != nil {
			t.Fatalf("create (team %s) = %d %s", team, resp.StatusCode, b)
		}
		id[team] = s.SandboxID
	}
	appendSync(t, al,
		audit.Event{Type: audit.TypeProcEnd, SandboxID: id["a"], Actor: "daemon"},
		audit.Event{Type: audit.TypeProcEnd, SandboxID: id["b"], Actor: "daemon"},
		audit.Event{Type: "daemon.start", Actor: "daemon"})
	records := func(k string) []audit.Record {
		resp, b := e.do(t, "GET", "/audit", "", "X-API-Key: "+k)
		var recs []audit.Record
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &recs) != nil {
			t.Fatalf("GET /audit = %d %s", resp.StatusCode, b)
		}
		return recs
	}
	mine := func(recs []audit.Record, team string) (own, other int) {
		for _, r := range recs {
			switch {
			case r.Sandbox == id[team] || strings.Contains(string(r.Data), id[team]):
				own++
			case r.Sandbox != "" || r.Type == "daemon.start" || !strings.Contains(r.Actor, "team:"):
				other++
			}
		}
		return own, other
	}
	for _, team := range []string{"a", "b"} {
		recs := records(key[team])
		if own, other := mine(recs, team); own == 0 || other != 0 {
			t.Errorf("GET /audit (team %s) = %d own records, %d others': %+v", team, own, other, recs)
		}
		for _, r := range recs {
			if other := map[string]string{"a": "b", "b": "a"}[team]; r.Sandbox == id[other] {
				t.Errorf("team %s reads team %s's record %+v", team, other, r)
			}
		}
	}
	if all := records(testKey); len(all) < 5 {
		t.Errorf("GET /audit (bootstrap) = %d records, want every one", len(all))
	}

	// The stream: backlog and live records, up to a marker of team b's.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/audit/stream", nil)
	req.Header.Set("X-API-Key", key["b"])
	resp, err := e.srv.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	appendSync(t, al,
		audit.Event{Type: audit.TypeProcEnd, SandboxID: id["a"], Actor: "daemon"},
		audit.Event{Type: "daemon.stop", Actor: "daemon"},
		audit.Event{Type: "x.marker", SandboxID: id["b"], Actor: "daemon"})
	sc := bufio.NewScanner(resp.Body)
	seen := 0
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		seen++
		if strings.Contains(line, id["a"]) || strings.Contains(line, "daemon.st") {
			t.Errorf("team b's stream sent %s", line)
		}
		if strings.Contains(line, "x.marker") {
			break
		}
	}
	if seen < 2 {
		t.Errorf("team b's stream sent %d records, want its backlog and the marker", seen)
	}
}

// TestOtherTeamsApprovalsAreMissing: an approval request of a team's
// sandbox is listed, streamed and decided by that team alone; to another
// team it is a missing one.
func TestOtherTeamsApprovalsAreMissing(t *testing.T) {
	e := newTeamsEnv(t)
	code, body := e.as(t, "team-a", "POST", "/v2/sandboxes", `{"templateID":"base","timeout":300}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /v2/sandboxes (a) = %d %s", code, body)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(body), &sb); err != nil {
		t.Fatal(err)
	}
	got := make(chan approvals.Decision, 1)
	go func() {
		d, _ := e.approvals.Ask(context.Background(), sb.SandboxID, "", "example.com")
		got <- d
	}()
	var list []approvals.Request
	for len(list) == 0 {
		_, b := e.as(t, "team-a", "GET", "/approvals", "")
		if err := json.Unmarshal([]byte(b), &list); err != nil {
			t.Fatalf("GET /approvals (a): %v %s", err, b)
		}
		time.Sleep(time.Millisecond)
	}
	if code, b := e.as(t, "team-b", "GET", "/approvals", ""); code != http.StatusOK || strings.TrimSpace(b) != "[]" {
		t.Errorf("GET /approvals (b) = %d %s, want an empty list", code, b)
	}
	_, missing := e.as(t, "team-b", "POST", "/approvals/apr_missing", `{"decision":"once"}`)
	code, b := e.as(t, "team-b", "POST", "/approvals/"+list[0].ID, `{"decision":"sandbox"}`)
	if code != http.StatusNotFound || strings.ReplaceAll(b, list[0].ID, "apr_missing") != missing {
		t.Errorf("POST /approvals/{a's} (b) = %d %s, want the 404 of a missing one (%s)", code, b, missing)
	}
	if code, b := e.as(t, "team-a", "POST", "/approvals/"+list[0].ID, `{"decision":"deny"}`); code != http.StatusOK {
		t.Fatalf("POST /approvals (a) = %d %s", code, b)
	}
	if d := <-got; d != approvals.Deny {
		t.Errorf("the held lookup got %q, want deny (team b's decision must not count)", d)
	}
}
