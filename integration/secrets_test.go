package integration

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestSecretsAtRest stores secrets through the real daemon and CLI, then
// looks for their values in every file under the data dir (as root, who
// can read them all): only sealed values may be there. The key file is
// root's alone, and after a restart the stored value still opens with it.
// A key file others may read stops the daemon at start.
func TestSecretsAtRest(t *testing.T) {
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	v1 := "ghp_first_" + randHex(16)
	v2 := "ghp_second_" + randHex(16)
	out, errs, code := d.fenceCLI(t, strings.NewReader(v1+"\n"), "secret", "create", "GH-Token", "--metadata", "owner=ci")
	id := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(id, "sec_") {
		t.Fatalf("fence secret create = %d %q %q", code, out, errs)
	}
	if out, errs, code := d.fenceCLI(t, strings.NewReader(v2), "secret", "update", "gh-token"); code != 0 || !strings.Contains(out, "version 2") {
		t.Fatalf("fence secret update = %d %q %q", code, out, errs)
	}
	out, _, _ = d.fenceCLI(t, nil, "secret", "list", "--json")
	if strings.Contains(out, v1) || strings.Contains(out, v2) || !strings.Contains(out, `"gh-token"`) {
		t.Errorf("fence secret list --json = %s", out)
	}

	keyPath := filepath.Join(dataDir, "secrets.key")
	st, err := os.Lstat(keyPath)
	if err != nil {
		t.Fatalf("no key file: %v", err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if st.Mode() != 0o600 || st.Size() != 32 || sys.Uid != 0 {
		t.Errorf("key file %v, %d bytes, uid %d; want -rw------- root, 32 bytes", st.Mode(), st.Size(), sys.Uid)
	}

	// Stop the daemon so the WAL is checkpointed into the database file
	// too, then search everything.
	d.Stop()
	found, searched := 0, 0
	filepath.WalkDir(dataDir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		searched++
		for _, v := range []string{v1, v2} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a secret value in clear", p)
			}
		}
		if bytes.Contains(b, []byte("gh-token")) {
			found++
		}
		return nil
	})
	if found == 0 {
		t.Fatalf("the secret's name is in none of the %d files under %s: the search proves nothing", searched, dataDir)
	}

	// The sealed value opens again with the key file, as the gateway's
	// store does after a restart.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := store.Open(ctx, filepath.Join(dataDir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	sec, err := secrets.Open(secrets.Options{DB: db, KeyPath: keyPath})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := sec.Value(ctx, id); err != nil || v != v2 {
		t.Errorf("Value after the daemon stopped = %q, %v; want the second value", v, err)
	}
	db.Close()

	// A key file its group may read: the daemon refuses to start.
	if err := os.Chmod(keyPath, 0o640); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer scancel()
	cmd := exec.CommandContext(sctx, testutil.FenceBinary(t), "serve", "--addr", "127.0.0.1:0",
		"--data-dir", dataDir, "--templates-dir", templatesDir(t), "--warm-pool", "0")
	cmd.Env = append(os.Environ(), "FENCE_API_KEY="+d.Key)
	b, err := cmd.CombinedOutput()
	if err == nil || sctx.Err() != nil || !strings.Contains(string(b), "secrets key") || !strings.Contains(string(b), "0640") {
		t.Errorf("fence serve with a group-readable key = %v (ctx %v):\n%s", err, sctx.Err(), b)
	}
	unmountUnder(dataDir)
	os.Chmod(keyPath, 0o600)
}
