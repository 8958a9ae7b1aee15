package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRunBindRootProject proves the README's `fence run -v
// $PWD:/workspace -w /workspace -- ls`, run by root in a directory of
// root's (a root user's project): the sandbox lists and writes the
// project, what its user writes lands owned by root, its root creates
// nothing there, no set-user-ID file can be planted, and the places that
// would hand over the host are refused with the reason. Root: `fence run`
// makes the sandbox's namespaces, cgroups and mounts.
func TestRunBindRootProject(t *testing.T) {
	dataDir := newDataDir(t)
	tdir := templatesDir(t)
	fenceRun := func(t *testing.T, args ...string) (string, string, int) {
		t.Helper()
		return runFence(t, nil, nil, append([]string{"run", "--data-dir", dataDir, "--templates-dir", tdir}, args...)...)
	}
	// The runs below make it; made here, its refusal does not hang on
	// their success.
	if err := os.MkdirAll(filepath.Join(dataDir, "native"), 0o711); err != nil {
		t.Fatal(err)
	}
	// A project of root's: t.TempDir makes it as the test's user, root.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("project dir %s: %v, want one owned by root", dir, err)
	}
	t.Run("README example", func(t *testing.T) {
		t.Chdir(dir)
		out, errs, code := fenceRun(t, "-v", dir+":/workspace", "-w", "/workspace", "--", "ls")
		if code != 0 || out != "main.go\n" {
			t.Errorf("fence run -v %s:/workspace -w /workspace -- ls = %q, exit %d (stderr %q); want \"main.go\\n\", exit 0", dir, out, code, errs)
		}
	})
	t.Run("user writes as root", func(t *testing.T) {
		out, errs, code := fenceRun(t, "-v", dir+":/workspace", "-w", "/workspace", "--", "sh", "-c", "id -u; echo written > out.txt")
		if code != 0 || out != "1000\n" {
			t.Fatalf("writing /workspace/out.txt: stdout %q, exit %d (stderr %q); want the sandbox's user (1000), exit 0", out, code, errs)
		}
		p := filepath.Join(dir, "out.txt")
		b, err := os.ReadFile(p)
		if err != nil || string(b) != "written\n" {
			t.Errorf("DIR/out.txt = %q, %v; want \"written\\n\"", b, err)
		}
		if st, err := os.Lstat(p); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 || st.Sys().(*syscall.Stat_t).Gid != 0 {
			t.Errorf("DIR/out.txt: %v, %+v; want it owned by root:root, the directory's owner", err, st)
		}
	})
	t.Run("sandbox root creates nothing", func(t *testing.T) {
		out, _, code := fenceRun(t, "-u", "root", "-v", dir+":/workspace", "-w", "/workspace", "--", "sh", "-c", "touch by-root; echo rc=$?")
		if code != 0 || !strings.Contains(out, "rc=1") {
			t.Errorf("touch by the sandbox's root: %q (exit %d), want rc=1", out, code)
		}
		if _, err := os.Lstat(filepath.Join(dir, "by-root")); !os.IsNotExist(err) {
			t.Errorf("DIR/by-root: %v; the sandbox's root created a file in the bind", err)
		}
	})
	t.Run("no set-user-ID file of root's", func(t *testing.T) {
		// Owned by root on the host, a set-user-ID copy of a shell would
		// be a root shell for anyone there.
		script := "cp /bin/busybox suid; chmod u+s suid; echo u=$?; chmod g+s suid; echo g=$?; chmod 4755 suid; echo m=$?"
		for _, user := range []string{"user", "root"} {
			out, errs, _ := fenceRun(t, "-u", user, "-v", dir+":/workspace", "-w", "/workspace", "--", "sh", "-c", script)
			if strings.Contains(out, "=0") {
				t.Errorf("as %s: %q (stderr %q): a set-id chmod succeeded", user, out, errs)
			}
		}
		st, err := os.Lstat(filepath.Join(dir, "suid"))
		if err != nil {
			t.Fatalf("DIR/suid: %v (the sandbox's user could not even copy a file)", err)
		}
		if st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("DIR/suid on the host: mode %v, owner %d; a set-id file planted", st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
		}
	})
	t.Run("no file capability of root's", func(t *testing.T) {
		// The sandbox's root holds CAP_SETFCAP over the user's files; in a
		// bind of root's a capability set with the user as its root id
		// would land as a capability of host root's: any host user
		// running the file would gain it.
		helper := buildSetFCap(t)
		if err := os.WriteFile(filepath.Join(dir, "setfcap"), helper, 0o755); err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, "capped")
		if err := os.WriteFile(target, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		out, errs, _ := fenceRun(t, "-u", "root", "-v", dir+":/workspace", "-w", "/workspace", "--", "./setfcap", "capped", "1000", "0")
		if !strings.Contains(out, "v2:") {
			t.Fatalf("the helper did not run: stdout %q, stderr %q", out, errs)
		}
		buf := make([]byte, 64)
		if n, err := syscall.Getxattr(target, "security.capability", buf); err != syscall.ENODATA {
			t.Errorf("DIR/capped on the host has security.capability %x (%v) after the sandbox's root set it (%q): a file capability planted", buf[:max(n, 0)], err, out)
		}
	})
	t.Run("privileged files refuse the bind", func(t *testing.T) {
		// The sandbox's user could rewrite a set-id or capability-bearing
		// file of root's through a shared mapping, which keeps the bits.
		v2 := []byte{1, 0, 0, 2, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // CAP_SETUID, effective
		for _, tc := range []struct {
			name string
			make func(string) error
			why  string
		}{
			{"setuid", func(p string) error { return os.Chmod(p, os.ModeSetuid|0o755) }, "set-user-ID"},
			{"setgid", func(p string) error { return os.Chmod(p, os.ModeSetgid|0o755) }, "set-group-ID"},
			{"capability", func(p string) error { return syscall.Setxattr(p, "security.capability", v2, 0) }, "file capabilities"},
		} {
			proj := t.TempDir()
			os.Chmod(proj, 0o755)
			f := filepath.Join(proj, "sub", "tool")
			os.Mkdir(filepath.Dir(f), 0o755)
			if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(f); err != nil {
				t.Fatal(err)
			}
			out, errs, code := fenceRun(t, "-v", proj+":/workspace", "--", "echo", "ran")
			if code == 0 || strings.Contains(out, "ran") || !strings.Contains(errs, tc.why) || !strings.Contains(errs, f) {
				t.Errorf("%s: fence run -v PROJ:/workspace with %s: exit %d, stdout %q, stderr %q; want a refusal naming it", tc.name, f, code, out, errs)
			}
			if _, errs, code := fenceRun(t, "-v", proj+":/workspace:ro", "--", "true"); code != 0 {
				t.Errorf("%s: the read-only bind of the same project: exit %d, stderr %q", tc.name, code, errs)
			}
		}
	})
	t.Run("symlinks inside stay inside", func(t *testing.T) {
		// A symlink in the project resolves in the sandbox's own tree:
		// writing through it reaches the sandbox's /etc, not the host's.
		for name, target := range map[string]string{"abs": "/etc", "rel": "../../../../../../etc"} {
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		probe := "fence-bind-escape-" + filepath.Base(dir)
		fenceRun(t, "-u", "root", "-v", dir+":/workspace", "-w", "/workspace", "--", "sh", "-c", "echo x > abs/"+probe+"; echo x > rel/"+probe+".rel")
		for _, p := range []string{"/etc/" + probe, "/etc/" + probe + ".rel"} {
			if _, err := os.Lstat(p); !os.IsNotExist(err) {
				os.Remove(p)
				t.Errorf("%s on the host: %v; a symlink in a bind let the sandbox write outside it", p, err)
			}
		}
	})
	t.Run("refused places", func(t *testing.T) {
		link := filepath.Join(t.TempDir(), "etc-link")
		if err := os.Symlink("/etc", link); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ src, why string }{
			{"/", "host's root"},
			{"/etc", "host's configuration"},
			{"/usr", "host's programs"},
			{"/run", "runtime state"},
			{"/root", "root's home"},
			{dataDir, "fence's directory"},
			{filepath.Join(dataDir, "native"), "fence's directory"},
			{tdir, "fence's directory"},
			{link, "host's configuration"},
		} {
			out, errs, code := fenceRun(t, "-v", tc.src+":/workspace", "--", "echo", "ran")
			if code == 0 || strings.Contains(out, "ran") || !strings.Contains(errs, tc.why) {
				t.Errorf("fence run -v %s:/workspace: exit %d, stdout %q, stderr %q; want a refusal naming %q", tc.src, code, out, errs, tc.why)
			}
		}
	})
}

// setFCapSrc sets security.capability (CAP_SETUID, effective) on the file
// os.Args[1]: as a v3 capability with each root id in os.Args[2:], then
// as a v2 one. It prints each result.
const setFCapSrc = `package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

func main() {
	for _, a := range os.Args[2:] {
		id, _ := strconv.Atoi(a)
		v := make([]byte, 24)
		binary.LittleEndian.PutUint32(v[0:], 0x03000001)
		binary.LittleEndian.PutUint32(v[4:], 1<<7)
		binary.LittleEndian.PutUint32(v[20:], uint32(id))
		fmt.Printf("v3 root id %d: %v\n", id, syscall.Setxattr(os.Args[1], "security.capability", v, 0))
	}
	v := make([]byte, 20)
	binary.LittleEndian.PutUint32(v[0:], 0x02000001)
	binary.LittleEndian.PutUint32(v[4:], 1<<7)
	fmt.Printf("v2: %v\n", syscall.Setxattr(os.Args[1], "security.capability", v, 0))
}
`

// buildSetFCap builds setFCapSrc as a static binary for a sandbox and
// returns it.
func buildSetFCap(t *testing.T) []byte {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(setFCapSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module setfcap\n\ngo 1.22\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(src, "setfcap")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the set-capability helper: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
