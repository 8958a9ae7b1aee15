package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// teamWithToken makes a team in e's store and returns its ID and an
// access token of it.
func teamWithToken(t *testing.T, e *testEnv) (team, token string) {
	t.Helper()
	tm, err := e.st.CreateTeam(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := e.st.Mint(t.Context(), tm.ID, store.KindAccessToken, "laptop", "")
	if err != nil {
		t.Fatal(err)
	}
	return tm.ID, tok
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

// TestAPIKeyRoutes mints, lists, renames and revokes a team's API keys
// with its access token, and checks the masks and that the value is
// shown once.
func TestAPIKeyRoutes(t *testing.T) {
	e := newTestEnv(t)
	team, tok := teamWithToken(t, e)
	bearer := "Authorization: Bearer " + tok

	resp, b := e.do(t, "POST", "/api-keys", `{"name":"ci"}`, bearer)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("POST /api-keys = %d %s", resp.StatusCode, b)
	}
	created := decode[api.CreatedTeamAPIKey](t, b)
	m := created.Mask
	if !strings.HasPrefix(created.Key, "e2b_") || m.Prefix != "e2b_" || m.ValueLength != len(created.Key)-4 ||
		!strings.HasPrefix(created.Key[4:], m.MaskedValuePrefix) || !strings.HasSuffix(created.Key, m.MaskedValueSuffix) ||
		len(m.MaskedValuePrefix) != 2 || len(m.MaskedValueSuffix) != 4 || created.CreatedBy == nil || created.LastUsed != nil {
		t.Fatalf("created key = %s", b)
	}

	// The new key works, as its team, and cannot manage keys.
	resp, b = e.do(t, "GET", "/v2/sandboxes", "", "X-API-Key: "+created.Key)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v2/sandboxes with the new key = %d %s", resp.StatusCode, b)
	}
	if resp, b := e.do(t, "GET", "/api-keys", "", "X-API-Key: "+created.Key); resp.StatusCode != 401 {
		t.Fatalf("GET /api-keys with an API key = %d %s, want 401", resp.StatusCode, b)
	}

	resp, b = e.do(t, "GET", "/api-keys", "", bearer)
	if resp.StatusCode != 200 || strings.Contains(string(b), created.Key[4:]) {
		t.Fatalf("GET /api-keys = %d %s (must not show the key)", resp.StatusCode, b)
	}
	list := decode[[]api.TeamAPIKey](t, b)
	if len(list) != 1 || list[0].ID != created.ID || list[0].Mask != created.Mask || list[0].LastUsed == nil {
		t.Fatalf("GET /api-keys = %s", b)
	}
	// The default team's keys are another team's: not listed, not found.
	if resp, b := e.api(t, "GET", "/api-keys", ""); resp.StatusCode != 200 || strings.Contains(string(b), created.ID) {
		t.Fatalf("the admin's team lists another team's key: %d %s", resp.StatusCode, b)
	}
	if resp, b := e.api(t, "DELETE", "/api-keys/"+created.ID, ""); resp.StatusCode != 404 {
		t.Fatalf("DELETE of another team's key = %d %s, want 404", resp.StatusCode, b)
	}

	if resp, b := e.do(t, "PATCH", "/api-keys/"+created.ID, `{"name":"ci2"}`, bearer); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("PATCH = %d %s", resp.StatusCode, b)
	}
	if resp, b := e.do(t, "DELETE", "/api-keys/"+created.ID, "", bearer); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", resp.StatusCode, b)
	}
	if resp, b := e.do(t, "GET", "/v2/sandboxes", "", "X-API-Key: "+created.Key); resp.StatusCode != 401 {
		t.Fatalf("a revoked key = %d %s, want 401", resp.StatusCode, b)
	}
	if resp, b := e.do(t, "DELETE", "/api-keys/"+created.ID, "", bearer); resp.StatusCode != 404 {
		t.Fatalf("DELETE of a revoked key = %d %s, want 404", resp.StatusCode, b)
	}
	if list, _ := e.st.Credentials(t.Context(), team, store.KindAPIKey); len(list) != 0 {
		t.Fatalf("keys left: %+v", list)
	}
}

// TestIdentityBadInput: each refused request answers a clear 4xx and
// changes nothing.
func TestIdentityBadInput(t *testing.T) {
	e := newTestEnv(t)
	team, tok := teamWithToken(t, e)
	bearer := "Authorization: Bearer " + tok
	_, k, err := e.st.MintAPIKey(t.Context(), team, "keep")
	if err != nil {
		t.Fatal(err)
	}
	big := `{"name":"` + strings.Repeat("n", 10<<10) + `"}`
	unknown := "00000000-0000-4000-8000-00000000ffff"
	for _, c := range []struct {
		method, path, body, hdr string
		status                  int
		msg                     string
	}{
		{"POST", "/api-keys", big, bearer, 400, "more than 256"},
		{"POST", "/api-keys", `{}`, bearer, 400, "name is required"},
		{"POST", "/api-keys", `{"name":`, bearer, 400, "malformed JSON"},
		{"PATCH", "/api-keys/" + k.ID, big, bearer, 400, "more than 256"},
		{"PATCH", "/api-keys/not-a-uuid", `{"name":"x"}`, bearer, 400, "Error when parsing API key ID"},
		{"DELETE", "/api-keys/" + unknown, "", bearer, 404, "id not found"},
		{"POST", "/access-tokens", big, bearer, 400, "more than 256"},
		{"POST", "/admin/teams", big, "X-API-Key: " + testKey, 400, "more than 256"},
		{"POST", "/admin/teams/" + unknown + "/api-keys", `{"name":"x"}`, "X-API-Key: " + testKey, 404, "Team not found"},
		{"POST", "/admin/teams/nope/api-keys", `{"name":"x"}`, "X-API-Key: " + testKey, 400, "Invalid team ID"},
		{"DELETE", "/admin/teams/" + team + "/api-keys/" + unknown, "", "X-API-Key: " + testKey, 404, "API key not found"},
		{"GET", "/v2/sandboxes", "", "X-API-Key: " + testKey + "\nX-Team-ID: " + unknown, 404, "Team not found"},
		{"POST", "/admin/teams", `{"name":"x"}`, bearer, 401, "needs the admin key"},
		{"GET", "/admin/teams", "", "X-API-Key: e2b_00", 401, "invalid API key"},
		{"GET", "/api-keys", "", "Authorization: Bearer sk_e2b_00", 401, "invalid access token"},
		{"GET", "/v2/sandboxes", "", bearer + "\nX-Team-ID: " + tenancy.DefaultTeamID, 401, "does not belong to"},
	} {
		resp, b := e.do(t, c.method, c.path, c.body, strings.Split(c.hdr, "\n")...)
		ae := decode[api.Error](t, b)
		if resp.StatusCode != c.status || ae.Code != c.status || !strings.Contains(ae.Message, c.msg) {
			t.Errorf("%s %s = %d %.200s, want %d ~%q", c.method, c.path, resp.StatusCode, b, c.status, c.msg)
		}
	}
	keys, _ := e.st.Credentials(t.Context(), team, store.KindAPIKey)
	toks, _ := e.st.Credentials(t.Context(), team, store.KindAccessToken)
	teams, _ := e.st.Teams(t.Context())
	if len(keys) != 1 || keys[0].Name != "keep" || len(toks) != 1 || len(teams) != 2 {
		t.Fatalf("refused requests changed something: keys %+v, tokens %+v, teams %d", keys, toks, len(teams))
	}
}

// TestAdminRoutes: the bootstrap key makes teams and their keys; a team's
// key acts for its team (the principal in the request's context, the
// audit actor naming the team and key ID).
func TestAdminRoutes(t *testing.T) {
	e, al := newAuditEnv(t)
	admin := "X-API-Key: " + testKey
	resp, b := e.do(t, "POST", "/admin/teams", `{"name":"acme"}`, admin)
	if resp.StatusCode != 201 {
		t.Fatalf("POST /admin/teams = %d %s", resp.StatusCode, b)
	}
	team := decode[api.TeamInfo](t, b)
	resp, b = e.do(t, "POST", "/admin/teams/"+team.TeamID+"/api-keys", `{"name":"ci"}`, admin)
	if resp.StatusCode != 201 {
		t.Fatalf("POST /admin/teams/{id}/api-keys = %d %s", resp.StatusCode, b)
	}
	key := decode[api.CreatedTeamAPIKey](t, b)
	if key.CreatedBy != nil {
		t.Errorf("an admin-made key names a maker: %s", b)
	}
	resp, b = e.do(t, "GET", "/admin/teams", "", admin)
	if teams := decode[[]api.TeamInfo](t, b); resp.StatusCode != 200 || len(teams) != 2 || teams[0].TeamID != tenancy.DefaultTeamID {
		t.Fatalf("GET /admin/teams = %d %s", resp.StatusCode, b)
	}
	if resp, b := e.do(t, "GET", "/admin/teams", "", "X-API-Key: "+key.Key); resp.StatusCode != 401 {
		t.Fatalf("GET /admin/teams with a team key = %d %s", resp.StatusCode, b)
	}
	// The admin acts for the team with X-Team-ID.
	resp, b = e.do(t, "GET", "/api-keys", "", admin, "X-Team-ID: "+team.TeamID)
	if l := decode[[]api.TeamAPIKey](t, b); resp.StatusCode != 200 || len(l) != 1 || l[0].ID != key.ID {
		t.Fatalf("GET /api-keys as the team = %d %s", resp.StatusCode, b)
	}

	// An action of the team's key is recorded with its team and key ID.
	if resp, b := e.do(t, "DELETE", "/sandboxes/nosuchbox", "", "X-API-Key: "+key.Key); resp.StatusCode != 404 {
		t.Fatalf("DELETE /sandboxes/nosuchbox = %d %s", resp.StatusCode, b)
	}
	if err := al.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp, b = e.do(t, "GET", "/audit?type=api", "", admin)
	want := "team:" + team.TeamID + " key:" + key.ID
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"actor":"`+want+`"`) || strings.Contains(string(b), key.Key[4:]) {
		t.Fatalf("audit of the team key's action (want actor %q, never the key): %s", want, b)
	}

	resp, b = e.do(t, "DELETE", "/admin/teams/"+team.TeamID+"/api-keys/"+key.ID, "", admin)
	if resp.StatusCode != 204 {
		t.Fatalf("admin DELETE = %d %s", resp.StatusCode, b)
	}
	if resp, _ := e.do(t, "GET", "/v2/sandboxes", "", "X-API-Key: "+key.Key); resp.StatusCode != 401 {
		t.Fatalf("a key the admin revoked = %d", resp.StatusCode)
	}
}

// TestTeamsAndAccessTokens: GET /teams gives the caller's team with a new
// key; access tokens are made and revoked, and a revoked one fails.
func TestTeamsAndAccessTokens(t *testing.T) {
	e := newTestEnv(t)
	team, tok := teamWithToken(t, e)
	bearer := "Authorization: Bearer " + tok
	resp, b := e.do(t, "GET", "/teams", "", bearer)
	teams := decode[[]api.Team](t, b)
	if resp.StatusCode != 200 || len(teams) != 1 || teams[0].TeamID != team || !teams[0].IsDefault ||
		!strings.HasPrefix(teams[0].APIKey, "e2b_") {
		t.Fatalf("GET /teams = %d %s", resp.StatusCode, b)
	}
	if resp, b := e.do(t, "GET", "/v2/sandboxes", "", "X-API-Key: "+teams[0].APIKey); resp.StatusCode != 200 {
		t.Fatalf("the key of GET /teams = %d %s", resp.StatusCode, b)
	}
	resp, b = e.do(t, "POST", "/access-tokens", `{"name":"ci"}`, bearer)
	nt := decode[api.CreatedAccessToken](t, b)
	if resp.StatusCode != 201 || !strings.HasPrefix(nt.Token, "sk_e2b_") || nt.Mask.Prefix != "sk_e2b_" {
		t.Fatalf("POST /access-tokens = %d %s", resp.StatusCode, b)
	}
	resp, b = e.do(t, "GET", "/access-tokens", "", bearer)
	if l := decode[[]api.AccessToken](t, b); resp.StatusCode != 200 || len(l) != 2 || strings.Contains(string(b), nt.Token[7:]) {
		t.Fatalf("GET /access-tokens = %d %s", resp.StatusCode, b)
	}
	if resp, b := e.do(t, "DELETE", "/access-tokens/"+nt.ID, "", bearer); resp.StatusCode != 204 {
		t.Fatalf("DELETE /access-tokens = %d %s", resp.StatusCode, b)
	}
	if resp, _ := e.do(t, "GET", "/api-keys", "", "Authorization: Bearer "+nt.Token); resp.StatusCode != 401 {
		t.Fatalf("a revoked access token = %d", resp.StatusCode)
	}
}

// TestRevocationEndsRequests: a revoked key is refused on its next request
// on the control plane and at the sandbox proxy, and its open
// /audit/stream ends.
func TestRevocationEndsRequests(t *testing.T) {
	e, _ := newAuditEnv(t)
	team, tok := teamWithToken(t, e)
	key, k, err := e.st.MintAPIKey(t.Context(), team, "doomed")
	if err != nil {
		t.Fatal(err)
	}
	s := e.create(t, `{"templateID":"base"}`)
	envd := append(sbxHeaders(s.SandboxID, s.EnvdAccessToken), "X-API-Key: "+key)
	if resp, b := e.do(t, "GET", "/envs", "", envd...); resp.StatusCode != 200 {
		t.Fatalf("envd with a live key = %d %s", resp.StatusCode, b)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/audit/stream", nil)
	req.Header.Set("X-API-Key", key)
	resp, err := e.srv.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	// The stream is open once its first bytes come (the backlog's end).
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadByte(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}

	if r, b := e.do(t, "DELETE", "/api-keys/"+k.ID, "", "Authorization: Bearer "+tok); r.StatusCode != 204 {
		t.Fatalf("DELETE = %d %s", r.StatusCode, b)
	}
	// The stream ends (EOF or a reset), well before its 30 s context.
	if _, err := io.Copy(io.Discard, br); ctx.Err() != nil {
		t.Fatalf("the revoked key's stream did not end (%v)", err)
	}

	if r, b := e.do(t, "GET", "/v2/sandboxes", "", "X-API-Key: "+key); r.StatusCode != 401 {
		t.Fatalf("control plane with a revoked key = %d %s", r.StatusCode, b)
	}
	if r, b := e.do(t, "GET", "/envs", "", envd...); r.StatusCode != 401 {
		t.Fatalf("envd with a revoked key = %d %s", r.StatusCode, b)
	}
	bearerEnvd := append(sbxHeaders(s.SandboxID, s.EnvdAccessToken), "Authorization: Bearer "+key)
	if r, b := e.do(t, "GET", "/envs", "", bearerEnvd...); r.StatusCode != 401 {
		t.Fatalf("envd with a revoked Bearer key = %d %s", r.StatusCode, b)
	}
	// Without a fence credential, sandbox traffic needs only its own token.
	if r, b := e.do(t, "GET", "/envs", "", sbxHeaders(s.SandboxID, s.EnvdAccessToken)...); r.StatusCode != 200 {
		t.Fatalf("envd with its token alone = %d %s", r.StatusCode, b)
	}
}

// TestMetricsAdminOnly: the daemon-wide Prometheus metrics are the
// admin's alone; a team's key gets 401.
func TestMetricsAdminOnly(t *testing.T) {
	e := newTestEnv(t)
	srv := httptest.NewServer(New(Options{Manager: e.m, Network: e.net, APIKey: testKey, Identity: e.st,
		Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fence_up 1\n") })}))
	t.Cleanup(srv.Close)
	e.srv = srv
	key, _, err := e.st.MintAPIKey(t.Context(), tenancy.DefaultTeamID, "prom")
	if err != nil {
		t.Fatal(err)
	}
	if resp, b := e.do(t, "GET", "/metrics", "", "Authorization: Bearer "+testKey); resp.StatusCode != 200 || string(b) != "fence_up 1\n" {
		t.Fatalf("/metrics as the admin = %d %s", resp.StatusCode, b)
	}
	for _, hdr := range []string{"Authorization: Bearer " + key, "X-API-Key: " + key} {
		if resp, b := e.do(t, "GET", "/metrics", "", hdr); resp.StatusCode != 401 || strings.Contains(string(b), "fence_up") {
			t.Errorf("/metrics with a team key (%s) = %d %s", hdr[:14], resp.StatusCode, b)
		}
	}
}

// TestRevocationsWatch: revoke ends every request of that key and no
// other's; a finished request leaves nothing behind.
func TestRevocationsWatch(t *testing.T) {
	var rv revocations
	a1, stop1 := rv.watch(t.Context(), "a")
	a2, stop2 := rv.watch(t.Context(), "a")
	b, stopB := rv.watch(t.Context(), "b")
	boot, stopBoot := rv.watch(t.Context(), tenancy.BootstrapKeyID)
	defer stopBoot()
	if boot != t.Context() {
		t.Error("the bootstrap key's requests are watched")
	}
	rv.revoke("a")
	for i, ctx := range []context.Context{a1, a2} {
		select {
		case <-ctx.Done():
		default:
			t.Errorf("request %d of the revoked key still runs", i)
		}
	}
	if b.Err() != nil {
		t.Error("another key's request ended")
	}
	stop1()
	stop2()
	stopB()
	rv.mu.Lock()
	n := len(rv.waiting)
	rv.mu.Unlock()
	if n != 0 {
		t.Errorf("%d keys still watched after their requests ended", n)
	}
}

// teamBoxes is a TeamSandboxes of fixed counts that records the teams it
// was asked to kill.
type teamBoxes struct {
	counts map[string]int
	killed []string
}

func (b *teamBoxes) RunningCounts(context.Context) (map[string]int, error) { return b.counts, nil }
func (b *teamBoxes) KillTeam(_ context.Context, team string) (int, int, error) {
	b.killed = append(b.killed, team)
	return b.counts[team], 0, nil
}

// TestAdminSandboxRoutes: the running counts (zeros left out) and a
// team's kill answer the admin alone, in E2B's shapes; bad input kills
// nothing; without a TeamSandboxes they answer 501.
func TestAdminSandboxRoutes(t *testing.T) {
	e := newTestEnv(t)
	team, tok := teamWithToken(t, e)
	boxes := &teamBoxes{counts: map[string]int{team: 2, tenancy.DefaultTeamID: 0}}
	srv := httptest.NewServer(New(Options{Manager: e.m, Network: e.net, APIKey: testKey, Identity: e.st, TeamSandboxes: boxes}))
	t.Cleanup(srv.Close)
	plain := e.srv
	e.srv = srv
	admin := "X-API-Key: " + testKey

	resp, b := e.do(t, "GET", "/admin/sandboxes/running-counts", "", admin)
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != `{"`+team+`":2}` {
		t.Fatalf("running counts = %d %s", resp.StatusCode, b)
	}
	for _, c := range []struct {
		path, hdr string
		status    int
	}{
		{"/admin/teams/" + team + "/sandboxes/kill", "Authorization: Bearer " + tok, 401},
		{"/admin/teams/nope/sandboxes/kill", admin, 400},
	} {
		if resp, b := e.do(t, "POST", c.path, "", c.hdr); resp.StatusCode != c.status {
			t.Errorf("POST %s = %d %s, want %d", c.path, resp.StatusCode, b, c.status)
		}
	}
	if resp, _ := e.do(t, "GET", "/admin/sandboxes/running-counts", "", "Authorization: Bearer "+tok); resp.StatusCode != 401 {
		t.Errorf("running counts with a team's token = %d, want 401", resp.StatusCode)
	}
	if len(boxes.killed) != 0 {
		t.Fatalf("refused requests killed %v", boxes.killed)
	}
	resp, b = e.do(t, "POST", "/admin/teams/"+team+"/sandboxes/kill", "", admin)
	if k := decode[api.KilledSandboxes](t, b); resp.StatusCode != 200 || k.KilledCount != 2 || len(boxes.killed) != 1 || boxes.killed[0] != team {
		t.Fatalf("kill = %d %s (killed %v)", resp.StatusCode, b, boxes.killed)
	}

	e.srv = plain
	if resp, _ := e.do(t, "POST", "/admin/teams/"+team+"/sandboxes/kill", "", admin); resp.StatusCode != 501 {
		t.Errorf("kill without TeamSandboxes = %d, want 501", resp.StatusCode)
	}
}
