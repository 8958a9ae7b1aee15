package cli

import (
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/store"
)

// TestTeamKeyTokenVerbs drives team create/list, key create/list/revoke
// and token create/list/revoke against the real routes and store.
func TestTeamKeyTokenVerbs(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	const admin = "e2b_00112233445566778899"
	srv := httptest.NewServer(httpapi.New(httpapi.Options{APIKey: admin, Identity: st}))
	t.Cleanup(srv.Close)
	t.Setenv("FENCE_URL", srv.URL)
	t.Setenv("FENCE_API_KEY", admin)

	code, out, stderr := execute(t, Deps{}, "", "team", "create", "acme")
	team := strings.TrimSpace(out)
	if code != 0 || len(team) != 36 {
		t.Fatalf("fence team create = %d %q %q", code, out, stderr)
	}
	if code, out, _ := execute(t, Deps{}, "", "team", "list"); code != 0 || !strings.Contains(out, team+"  acme") {
		t.Fatalf("fence team list = %d:\n%s", code, out)
	}
	code, out, stderr = execute(t, Deps{}, "", "key", "create", "ci", "--team", team)
	key := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, "e2b_") {
		t.Fatalf("fence key create = %d %q %q", code, out, stderr)
	}
	code, out, _ = execute(t, Deps{}, "", "key", "list", "--team", team)
	if code != 0 || !strings.Contains(out, "ci") || strings.Contains(out, key[4:]) || !strings.Contains(out, key[:6]+"…"+key[len(key)-4:]) {
		t.Fatalf("fence key list = %d (masked, never the key):\n%s", code, out)
	}
	keys, _ := st.Credentials(t.Context(), team, store.KindAPIKey)
	if len(keys) != 1 {
		t.Fatalf("keys = %+v", keys)
	}

	// A team's access token manages its own team's keys.
	code, out, stderr = execute(t, Deps{}, "", "token", "create", "owner", "--team", team)
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, "sk_e2b_") {
		t.Fatalf("fence token create = %d %q %q", code, out, stderr)
	}
	t.Setenv("FENCE_API_KEY", tok)
	if code, out, stderr := execute(t, Deps{}, "", "key", "list"); code != 0 || !strings.Contains(out, keys[0].ID) {
		t.Fatalf("fence key list with the team's token = %d %q %q", code, out, stderr)
	}
	if code, _, stderr := execute(t, Deps{}, "", "team", "create", "evil"); code != 1 || !strings.Contains(stderr, "401") {
		t.Fatalf("fence team create with a team's token = %d %q, want a 401", code, stderr)
	}
	if code, _, stderr := execute(t, Deps{}, "", "key", "revoke", keys[0].ID); code != 0 {
		t.Fatalf("fence key revoke = %d %q", code, stderr)
	}
	if _, err := st.Authenticate(t.Context(), store.KindAPIKey, key); err == nil {
		t.Fatal("the revoked key still authenticates")
	}
	if code, out, _ := execute(t, Deps{}, "", "token", "list"); code != 0 || !strings.Contains(out, "owner") || strings.Contains(out, tok[7:]) {
		t.Fatalf("fence token list = %d:\n%s", code, out)
	}
	toks, _ := st.Credentials(t.Context(), team, store.KindAccessToken)
	if code, _, stderr := execute(t, Deps{}, "", "token", "revoke", toks[0].ID); code != 0 {
		t.Fatalf("fence token revoke = %d %q", code, stderr)
	}
	if code, _, _ := execute(t, Deps{}, "", "key", "list"); code != 1 {
		t.Fatalf("fence key list with a revoked token = %d, want 1", code)
	}
}
