package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/tenancy"
	"github.com/fencesandbox/fence/internal/testutil"
)

// clusterKey writes a sealing key every node of a test cluster reads.
func clusterKey(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(path, bytes.Repeat([]byte{0x42}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestServeDatabaseUnreachable checks that fence serve with a database
// nobody answers at exits non-zero at once, saying which database (and
// not its password).
func TestServeDatabaseUnreachable(t *testing.T) {
	testutil.RequireRoot(t)
	_, stderr, code := runFence(t, nil, nil, "serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(testutil.StateDir(t), "data"),
		"--templates-dir", templatesDir(t), "--warm-pool", "0",
		"--database", "postgres://fence:hunter2@127.0.0.1:1/fence", "--secrets-key", clusterKey(t))
	if code == 0 || !strings.Contains(stderr, "reaching the database postgres://fence@127.0.0.1:1/fence") || strings.Contains(stderr, "hunter2") {
		t.Fatalf("fence serve with an unreachable database = exit %d, %q", code, stderr)
	}
}

// TestServeSharedDatabase runs two nodes on one PostgreSQL database and
// one sealing key: a secret stored through one is read through the
// other, an API key minted on one works on the other until revoked there,
// and a team's limit set on one holds for both.
func TestServeSharedDatabase(t *testing.T) {
	dsn := pgtest.New(t).Database(t)
	key := clusterKey(t)
	var nodes [2]*daemon
	for i, name := range []string{"a", "b"} {
		nodes[i] = startDaemon(t, filepath.Join(testutil.StateDir(t), name), "--database", dsn, "--secrets-key", key)
	}
	a, b := nodes[0], nodes[1]
	if r := a.do(t, "POST", "/secrets", a.Key, strings.NewReader(`{"name":"tok","value":"value-of-the-cluster-0123"}`), nil); r.Status != http.StatusCreated {
		t.Fatalf("POST /secrets on a = %d %s", r.Status, r.Body)
	}
	if r := b.do(t, "GET", "/secrets/tok", b.Key, nil, nil); r.Status != http.StatusOK {
		t.Fatalf("GET /secrets/tok on b = %d %s", r.Status, r.Body)
	}

	r := a.do(t, "POST", "/api-keys", a.Key, strings.NewReader(`{"name":"shared"}`), nil)
	var minted struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &minted) != nil || minted.Key == "" {
		t.Fatalf("POST /api-keys on a = %d %s", r.Status, r.Body)
	}
	if r := b.do(t, "GET", "/secrets", minted.Key, nil, nil); r.Status != http.StatusOK {
		t.Fatalf("a's key on b = %d %s", r.Status, r.Body)
	}
	if r := b.do(t, "DELETE", "/api-keys/"+minted.ID, b.Key, nil, nil); r.Status != http.StatusNoContent && r.Status != http.StatusOK {
		t.Fatalf("DELETE /api-keys on b = %d %s", r.Status, r.Body)
	}
	if r := a.do(t, "GET", "/secrets", minted.Key, nil, nil); r.Status != http.StatusUnauthorized {
		t.Fatalf("a key revoked on b, on a = %d %s", r.Status, r.Body)
	}

	if r := a.do(t, "PUT", "/teams/"+tenancy.DefaultTeamID+"/limits", a.Key, strings.NewReader(`{"concurrentSandboxes":1}`), nil); r.Status != http.StatusOK {
		t.Fatalf("PUT limits on a = %d %s", r.Status, r.Body)
	}
	sb := a.create(t, api.NewSandbox{})
	r = b.do(t, "POST", "/sandboxes", b.Key, strings.NewReader(`{"templateID":"minimal","timeout":300}`), nil)
	if r.Status != http.StatusTooManyRequests {
		t.Fatalf("a second sandbox on b with a's at the team's limit of 1 = %d %s", r.Status, r.Body)
	}
	if err := a.Client.Kill(ctxT(t), sb.ID()); err != nil {
		t.Fatal(err)
	}
	r = b.do(t, "POST", "/sandboxes", b.Key, strings.NewReader(`{"templateID":"minimal","timeout":300}`), nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("a sandbox on b after a's was killed = %d %s", r.Status, r.Body)
	}
	var made struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(r.Body, &made)
	b.do(t, "DELETE", "/sandboxes/"+made.SandboxID, b.Key, nil, nil)
}
