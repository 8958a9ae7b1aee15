package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/testutil"
)

// TestTemplateSymlinksStayInside runs templates whose /proc or /dev is a
// symlink leading out of the root, relative or absolute, the way a
// hostile image would try to make the runtime mount over host paths
// (runc CVE-2021-30465, CVE-2026-41579). fence init resolves every mount
// and setup target inside the sandbox's root: the start either fails
// cleanly or acts inside the sandbox, and the host directory the link
// names stays untouched: same entries, same mode (fence init makes /tmp
// mode 1777, which a link followed out would apply to the host's
// directory), nothing mounted on it. Root: fence run creates the
// sandbox's namespaces, cgroups and mounts.
func TestTemplateSymlinksStayInside(t *testing.T) {
	testutil.RequireRoot(t)
	src := filepath.Dir(testutil.RootFS(t, "minimal")) // the template: rootfs + its info
	// The host directory the links name lies outside /tmp, which one of
	// the links replaces.
	host, err := os.MkdirTemp("/var/tmp", "fence-symlink-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(host) })
	marker := filepath.Join(host, "host-file")
	if err := os.WriteFile(marker, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		link   string // path in the rootfs replaced by a symlink
		target string
		inRoot bool // the target also exists inside the root
		script string
	}{
		{"proc climbs out", "proc", strings.Repeat("../", 16) + strings.TrimPrefix(host, "/"), false, "true"},
		{"dev points at a host path", "dev", host, false, "true"},
		{"tmp points at a host path", "tmp", host, false, "true"},
		{"proc points at a path that exists inside too", "proc", host, true, "grep -q '^Pid:' /proc/self/status && echo proc-inside"},
		{"tmp points at a path that exists inside too", "tmp", host, true, "test -k /tmp && echo tmp-inside"},
	}
	before, err := os.Stat(host)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := testutil.StateDir(t)
			tdir, dataDir := filepath.Join(state, "templates"), filepath.Join(state, "data")
			if err := os.MkdirAll(tdir, 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("cp", "-a", src, filepath.Join(tdir, "minimal")).CombinedOutput(); err != nil {
				t.Fatalf("copying the template: %v: %s", err, out)
			}
			root := filepath.Join(tdir, "minimal", "rootfs")
			if err := os.RemoveAll(filepath.Join(root, tt.link)); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(tt.target, filepath.Join(root, tt.link)); err != nil {
				t.Fatal(err)
			}
			if tt.inRoot {
				if err := os.MkdirAll(filepath.Join(root, host), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			out, errs, code := runFence(t, nil, nil, "run", "--data-dir", dataDir, "--templates-dir", tdir, "--", "sh", "-c", tt.script)
			t.Logf("fence run: exit %d, stdout %q, stderr %q", code, out, errs)
			if tt.inRoot && (code != 0 || !strings.Contains(out, tt.link+"-inside")) {
				t.Errorf("with the link's target inside the root, /%s was not set up there: exit %d, %q, %q", tt.link, code, out, errs)
			}
			if st, err := os.Stat(host); err != nil || st.Mode() != before.Mode() {
				t.Errorf("the host directory the link names changed mode: %v → %v (%v)", before.Mode(), st.Mode(), err)
			}
			if names := dirEntries(host); !slices.Equal(names, []string{"host-file"}) {
				t.Errorf("the host directory the link names now holds %q", names)
			}
			if b, err := os.ReadFile(marker); err != nil || string(b) != "host\n" {
				t.Errorf("the host file behind the link = %q, %v", b, err)
			}
			if m := mountsUnder(host); len(m) > 0 {
				t.Errorf("mounted on the host directory the link names:\n%s", strings.Join(m, "\n"))
			}
			assertRunsLeftNothing(t, dataDir)
		})
	}
}
