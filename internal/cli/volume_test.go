package cli

import (
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/testutil"
	"github.com/fencesandbox/fence/internal/volume"
)

// TestVolumeVerbs drives volume create/list/delete against the real
// routes, store and volumes (a loop-mounted image: root only).
func TestVolumeVerbs(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	vs, err := volume.Open(t.Context(), volume.Options{Dir: filepath.Join(dir, "volumes"), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vs.Close() })
	const admin = "e2b_00112233445566778899"
	srv := httptest.NewServer(httpapi.New(httpapi.Options{APIKey: admin, Identity: st, Volumes: vs}))
	t.Cleanup(srv.Close)
	t.Setenv("FENCE_URL", srv.URL)
	t.Setenv("FENCE_API_KEY", admin)

	code, out, stderr := execute(t, Deps{}, "", "volume", "create", "cache", "--size-mb", "8")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 36 {
		t.Fatalf("fence volume create = %d %q %q", code, out, stderr)
	}
	if code, _, stderr := execute(t, Deps{}, "", "volume", "create", "bad name"); code != 1 || !strings.Contains(stderr, "Invalid volume name") {
		t.Errorf("fence volume create 'bad name' = %d %q", code, stderr)
	}
	if code, out, _ := execute(t, Deps{}, "", "volume", "list"); code != 0 || !strings.Contains(out, id+"  cache") {
		t.Errorf("fence volume list = %d:\n%s", code, out)
	}
	if code, _, stderr := execute(t, Deps{}, "", "volume", "delete", id); code != 0 {
		t.Errorf("fence volume delete = %d %q", code, stderr)
	}
	if code, _, stderr := execute(t, Deps{}, "", "volume", "delete", id); code != 1 || !strings.Contains(stderr, "404") {
		t.Errorf("fence volume delete again = %d %q, want a 404", code, stderr)
	}
	if code, out, _ := execute(t, Deps{}, "", "volume", "list", "--json"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Errorf("fence volume list --json after the delete = %d %q", code, out)
	}
}
