package template

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fencesandbox/fence/api"
)

// requireRoot skips when not root, except in CI where it fails: CI runs as
// root and must never skip a privileged test.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("test needs root, and CI must run it")
	}
	t.Skip("test needs root")
}

func newStore(t testing.TB, progress *bytes.Buffer) *Store {
	t.Helper()
	opts := Options{
		Dir:    t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if progress != nil {
		opts.Progress = progress
	}
	s, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// TestBuildMinimal builds the minimal template and checks its layout. It
// needs root to chown /home/user to 1000:1000.
func TestBuildMinimal(t *testing.T) {
	requireRoot(t)
	var progress bytes.Buffer
	s := newStore(t, &progress)
	if err := s.Build(t.Context(), "minimal"); err != nil {
		t.Fatalf("Build(minimal) = %v", err)
	}
	rootfs, err := s.Resolve("minimal")
	if err != nil {
		t.Fatalf("Resolve(minimal) = %v", err)
	}
	if want := filepath.Join(s.Dir(), "minimal", "rootfs"); rootfs != want {
		t.Errorf("Resolve(minimal) = %q, want %q", rootfs, want)
	}
	if !strings.Contains(progress.String(), "minimal: built") {
		t.Errorf("progress = %q, want a line with %q", progress.String(), "minimal: built")
	}

	type want struct {
		mode fs.FileMode // type and permission bits
		uid  uint32
		gid  uint32
	}
	tests := []struct {
		path string
		want want
	}{
		{"bin/busybox", want{0o755, 0, 0}},
		{"bin/sh", want{fs.ModeSymlink | 0o777, 0, 0}},
		{"bin/ls", want{fs.ModeSymlink | 0o777, 0, 0}},
		{"usr/bin/env", want{fs.ModeSymlink | 0o777, 0, 0}},
		{"etc/passwd", want{0o644, 0, 0}},
		{"etc/group", want{0o644, 0, 0}},
		{"etc/hostname", want{0o644, 0, 0}},
		{"etc/hosts", want{0o644, 0, 0}},
		{"etc/resolv.conf", want{0o644, 0, 0}},
		{"home/user", want{fs.ModeDir | 0o755, 1000, 1000}},
		{"tmp", want{fs.ModeDir | fs.ModeSticky | 0o777, 0, 0}},
		{"proc", want{fs.ModeDir | 0o555, 0, 0}},
		{"sys", want{fs.ModeDir | 0o555, 0, 0}},
		{"dev", want{fs.ModeDir | 0o755, 0, 0}},
		{"run", want{fs.ModeDir | 0o755, 0, 0}},
		{"root", want{fs.ModeDir | 0o700, 0, 0}},
		{".fence", want{fs.ModeDir | 0o755, 0, 0}},
	}
	for _, tt := range tests {
		fi, err := os.Lstat(filepath.Join(rootfs, tt.path))
		if err != nil {
			t.Errorf("Lstat(/%s) = %v", tt.path, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		got := want{fi.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSticky), st.Uid, st.Gid}
		if got != tt.want {
			t.Errorf("Lstat(/%s) = %v %d:%d, want %v %d:%d", tt.path, got.mode, got.uid, got.gid, tt.want.mode, tt.want.uid, tt.want.gid)
		}
	}
	for _, d := range []string{"proc", "sys", "dev", ".fence"} {
		if entries, _ := os.ReadDir(filepath.Join(rootfs, d)); len(entries) != 0 {
			t.Errorf("/%s has %d entries, want none", d, len(entries))
		}
	}

	// Every applet busybox lists is linked.
	out, err := exec.Command(filepath.Join(rootfs, "bin", "busybox"), "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	applets := strings.Fields(string(out))
	if len(applets) < 100 {
		t.Errorf("busybox --list gave %d applets, want hundreds", len(applets))
	}
	for _, a := range applets {
		if a == "busybox" {
			continue
		}
		if target, err := os.Readlink(filepath.Join(rootfs, "bin", a)); err != nil || target != "busybox" {
			t.Errorf("Readlink(/bin/%s) = %q, %v, want busybox", a, target, err)
		}
	}

	passwd, err := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"root:x:0:0:root:/root:/bin/sh",
		"user:x:1000:1000:user:/home/user:/bin/sh",
		"nobody:x:65534:65534:",
	} {
		if !strings.Contains(string(passwd), line) {
			t.Errorf("/etc/passwd = %q, want a line starting %q", passwd, line)
		}
	}

	// The tree works as a root filesystem.
	cmd := exec.CommandContext(t.Context(), "/bin/sh", "-c", "echo hello | wc -c")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/bin"}
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "6" {
		t.Errorf("chroot sh -c 'echo hello | wc -c' = %q, %v, want 6", out, err)
	}

	infos, err := s.List()
	if err != nil {
		t.Fatalf("List() = %v", err)
	}
	if len(infos) != 1 || infos[0].Name != "minimal" || infos[0].RootFS != rootfs ||
		infos[0].FormatVersion != FormatVersion || infos[0].SizeBytes < 1<<20 || infos[0].BuiltAt.IsZero() {
		t.Errorf("List() = %+v, want one minimal template of at least 1 MiB", infos)
	}
}

// TestBuildCached checks that a second build is a no-op and that Force
// replaces the tree.
func TestBuildCached(t *testing.T) {
	requireRoot(t)
	s := newStore(t, nil)
	if err := s.Build(t.Context(), "minimal"); err != nil {
		t.Fatalf("Build(minimal) = %v", err)
	}
	rootfs, _ := s.Resolve("minimal")
	marker := filepath.Join(rootfs, "marker")
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Build(t.Context(), "minimal"); err != nil {
		t.Fatalf("second Build(minimal) = %v", err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("second Build(minimal) rebuilt the template (marker gone: %v)", err)
	}
	if err := s.BuildWithOptions(t.Context(), "minimal", BuildOptions{Force: true}); err != nil {
		t.Fatalf("BuildWithOptions(minimal, Force) = %v", err)
	}
	if _, err := os.Stat(marker); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("BuildWithOptions(minimal, Force) kept the old tree (marker: %v)", err)
	}
	assertNoWorkDirs(t, s)

	if err := s.Remove("minimal"); err != nil {
		t.Fatalf("Remove(minimal) = %v", err)
	}
	if _, err := s.Resolve("minimal"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resolve(minimal) after Remove = %v, want ErrNotFound", err)
	}
	if err := s.Remove("minimal"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Remove(minimal) twice = %v, want ErrNotFound", err)
	}
	assertNoWorkDirs(t, s)
}

func assertNoWorkDirs(t *testing.T, s *Store) {
	t.Helper()
	entries, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".build-") || strings.HasPrefix(e.Name(), ".remove-") {
			t.Errorf("work dir %s left behind", e.Name())
		}
	}
}

func TestBadNames(t *testing.T) {
	s := newStore(t, nil)
	for _, name := range []string{"", ".", "..", "../x", "a/b", "/abs", "Minimal", ".build-x", "-x", "_x", "a b", "x\x00", strings.Repeat("a", 65)} {
		if err := s.Build(t.Context(), name); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Build(%q) = %v, want ErrInvalidArgument", name, err)
		}
		if _, err := s.Resolve(name); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Resolve(%q) = %v, want ErrInvalidArgument", name, err)
		}
		if err := s.Remove(name); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Remove(%q) = %v, want ErrInvalidArgument", name, err)
		}
	}
	if err := s.Build(t.Context(), "ubuntu"); !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "base, code-interpreter, desktop, mcp-gateway, minimal") {
		t.Errorf("Build(ubuntu) = %v, want ErrInvalidArgument listing the known templates", err)
	}
}

func TestResolveMissing(t *testing.T) {
	s := newStore(t, nil)
	_, err := s.Resolve("base")
	if !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Resolve(base) = %v, want ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "fence template build base") {
		t.Errorf("Resolve(base) = %q, want a hint to run `fence template build base`", err)
	}
	// A directory without template.json (a foreign or broken tree) is not a template.
	if err := os.MkdirAll(filepath.Join(s.Dir(), "minimal", "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve("minimal"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resolve(minimal) without template.json = %v, want ErrNotFound", err)
	}
	if infos, err := s.List(); err != nil || len(infos) != 0 {
		t.Errorf("List() = %v, %v, want none", infos, err)
	}
}

// TestCodeInterpreterAlias: the code-interpreter SDK's default template
// name resolves to the code-interpreter template (here built by a stand-in
// builder), and only once that is built.
func TestCodeInterpreterAlias(t *testing.T) {
	requireRoot(t)
	s := newStore(t, nil)
	if _, err := s.Resolve("code-interpreter-v1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Resolve(code-interpreter-v1) before the build = %v, want ErrNotFound", err)
	}
	s.builders["code-interpreter"] = buildMinimal
	if err := s.Build(t.Context(), "code-interpreter"); err != nil {
		t.Fatal(err)
	}
	want, err := s.Resolve("code-interpreter")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Resolve("code-interpreter-v1")
	if err != nil || got != want {
		t.Errorf("Resolve(code-interpreter-v1) = %q, %v; want %q", got, err, want)
	}
	if got := s.ReadyPorts("code-interpreter-v1"); !slices.Equal(got, []uint16{49999}) {
		t.Errorf("ReadyPorts(code-interpreter-v1) = %v, want [49999] (the server's port, recorded at build)", got)
	}
	if got := s.ReadyPorts("minimal"); got != nil {
		t.Errorf("ReadyPorts(minimal) = %v, want none", got)
	}
	if err := s.Build(t.Context(), "code-interpreter-v1"); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Build(code-interpreter-v1) = %v, want ErrInvalidArgument (an alias is not built)", err)
	}
}

// TestInterruptedBuild checks that a cancelled build leaves no template and
// that the next build removes a crashed build's leftovers.
func TestInterruptedBuild(t *testing.T) {
	requireRoot(t)
	s := newStore(t, nil)
	stale := filepath.Join(s.Dir(), ".build-minimal-deadbeef", "rootfs", "bin")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Build(ctx, "minimal"); !errors.Is(err, context.Canceled) {
		t.Errorf("Build(cancelled ctx) = %v, want context.Canceled", err)
	}
	if _, err := s.Resolve("minimal"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resolve(minimal) after cancelled build = %v, want ErrNotFound", err)
	}
	if _, err := os.Lstat(filepath.Join(s.Dir(), "minimal")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cancelled build left %s/minimal: %v", s.Dir(), err)
	}
	assertNoWorkDirs(t, s)

	// Cancel in the middle of the build: after the builder ran.
	ctx, cancel = context.WithCancel(t.Context())
	s.builders["minimal"] = func(ctx context.Context, s *Store, rootfs string) (string, error) {
		src, err := buildMinimal(ctx, s, rootfs)
		cancel()
		return src, err
	}
	if err := s.Build(ctx, "minimal"); !errors.Is(err, context.Canceled) {
		t.Errorf("Build(ctx cancelled mid-build) = %v, want context.Canceled", err)
	}
	if _, err := s.Resolve("minimal"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resolve(minimal) after cancelled build = %v, want ErrNotFound", err)
	}
	assertNoWorkDirs(t, s)
}

func TestMissingBusybox(t *testing.T) {
	old := busyboxPath
	busyboxPath = filepath.Join(t.TempDir(), "busybox")
	t.Cleanup(func() { busyboxPath = old })
	s := newStore(t, nil)
	err := s.Build(t.Context(), "minimal")
	if err == nil || !strings.Contains(err.Error(), "apt-get install busybox-static") {
		t.Errorf("Build(minimal) without busybox = %v, want a hint to apt-get install busybox-static", err)
	}
	if _, err := s.Resolve("minimal"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resolve(minimal) after failed build = %v, want ErrNotFound", err)
	}
}

func TestHostMirrors(t *testing.T) {
	tests := []struct {
		name         string
		files        map[string]string
		wantMirror   string
		wantSecurity string
	}{
		{"none", nil, defaultMirror, defaultSecurity},
		{"deb822", map[string]string{"sources.list.d/debian.sources": "Types: deb\n# http://snapshot.debian.org/archive/debian/x\nURIs: http://mirror.example/debian\nSuites: bookworm\n\nTypes: deb\nURIs: http://mirror.example/debian-security/\nSuites: bookworm-security\n"},
			"http://mirror.example/debian", "http://mirror.example/debian-security"},
		{"one-line", map[string]string{"sources.list": "# deb http://no/debian x\ndeb [signed-by=/k.gpg arch=amd64] https://m.example/debian bookworm main\ndeb-src http://src/debian bookworm main\n"},
			"https://m.example/debian", defaultSecurity},
		{"other distro", map[string]string{"sources.list": "deb http://archive.ubuntu.com/ubuntu noble main\n"}, defaultMirror, defaultSecurity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tt.files {
				p := filepath.Join(dir, name)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m, sec := hostMirrors(dir)
			if m != tt.wantMirror || sec != tt.wantSecurity {
				t.Errorf("hostMirrors() = %q, %q, want %q, %q", m, sec, tt.wantMirror, tt.wantSecurity)
			}
		})
	}
}

func TestLineWriter(t *testing.T) {
	var out bytes.Buffer
	w := &lineWriter{prefix: "p: ", w: &out}
	w.Write([]byte("one\ntw"))
	w.Write([]byte("o\r\n\nthree 10%\rthree 100%\nfour"))
	w.Flush()
	if want := "p: one\np: two\np: three 100%\np: four\n"; out.String() != want {
		t.Errorf("lineWriter output = %q, want %q", out.String(), want)
	}
	if want := "one\ntwo\nthree 100%\nfour"; w.Tail() != want {
		t.Errorf("Tail() = %q, want %q", w.Tail(), want)
	}
}

// TestBuildBase builds the Debian template with mmdebstrap (about 80 s and
// network access to the mirror), so it runs only with FENCE_TEST_BASE=1.
func TestBuildBase(t *testing.T) {
	if os.Getenv("FENCE_TEST_BASE") != "1" {
		t.Skip("set FENCE_TEST_BASE=1 to build the base template (≈80 s)")
	}
	requireRoot(t)
	var progress bytes.Buffer
	s := newStore(t, &progress)
	if err := s.Build(t.Context(), "base"); err != nil {
		t.Fatalf("Build(base) = %v\nprogress:\n%s", err, progress.String())
	}
	if !strings.Contains(progress.String(), "base: ") {
		t.Errorf("progress = %q, want mmdebstrap lines prefixed with %q", progress.String(), "base: ")
	}
	rootfs, err := s.Resolve("base")
	if err != nil {
		t.Fatalf("Resolve(base) = %v", err)
	}
	for _, p := range []string{"usr/bin/python3", "usr/bin/python", "usr/bin/pip", "usr/bin/node", "usr/bin/npm", "etc/pip.conf", "usr/bin/curl", "usr/bin/git", "usr/bin/sudo", "usr/bin/bash", "usr/bin/ps", "etc/ssl/certs/ca-certificates.crt", "etc/sudoers.d/user", ".fence", "home/user"} {
		if _, err := os.Stat(filepath.Join(rootfs, p)); err != nil {
			t.Errorf("Stat(/%s) = %v", p, err)
		}
	}
	for _, p := range []string{"usr/share/man", "usr/share/locale"} {
		if entries, _ := os.ReadDir(filepath.Join(rootfs, p)); len(entries) > 0 {
			t.Errorf("/%s has %d entries, want none", p, len(entries))
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(rootfs, "dev")); len(entries) != 0 {
		t.Errorf("/dev has %d entries, want none", len(entries))
	}
	passwd, _ := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if !strings.Contains(string(passwd), "user:x:1000:1000::/home/user:/bin/bash") {
		t.Errorf("/etc/passwd = %q, want user 1000:1000 with /bin/bash", passwd)
	}
	cmd := exec.CommandContext(t.Context(), "/bin/bash", "-c", "sudo -n -u root true && su user -c 'sudo -n id -u' && python3 -c 'print(6*7)' && "+
		"su user -c 'python -c \"print(7*8)\" && node -e \"console.log(8*9)\" && pip --version | cut -d\" \" -f1 && npm --version | cut -d. -f1 && python -m venv /tmp/venv && echo ok'")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	// Stdout only: sudo warns on stderr that it cannot resolve the host's
	// name (the backend writes /etc/hosts per sandbox).
	if out, err := cmd.Output(); err != nil || strings.TrimSpace(string(out)) != "0\n42\n56\n72\npip\n9\nok" {
		t.Errorf("chroot sudo/python/node/pip/npm = %q, %v, want \"0\\n42\\n56\\n72\\npip\\n9\\nok\"", out, err)
	}
	infos, _ := s.List()
	if len(infos) == 1 {
		t.Logf("base: %d MiB", infos[0].SizeBytes>>20)
	}
}

func TestStoreDirIsPrivate(t *testing.T) {
	parent := t.TempDir()
	fresh := filepath.Join(parent, "fresh")
	if _, err := New(Options{Dir: fresh}); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(parent, "old")
	if err := os.Mkdir(old, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(old, 0o755)
	if _, err := New(Options{Dir: old}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{fresh, old} {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v %v, want no group or other access", d, st.Mode(), err)
		}
	}
}

// TestMcpGatewayFromBase: mcp-gateway is base's tree (here a stand-in
// builder's) with the gateway's command linked to the in-sandbox binary;
// without base it is a clear error and no template.
func TestMcpGatewayFromBase(t *testing.T) {
	requireRoot(t)
	s := newStore(t, nil)
	if err := s.Build(t.Context(), "mcp-gateway"); err == nil || !strings.Contains(err.Error(), "fence template build base") {
		t.Fatalf("Build(mcp-gateway) without base = %v, want an error saying to build base", err)
	}
	if _, err := s.Resolve("mcp-gateway"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Resolve(mcp-gateway) after the failed build = %v, want ErrNotFound", err)
	}
	s.builders["base"] = buildMinimal
	if err := s.Build(t.Context(), "base"); err != nil {
		t.Fatal(err)
	}
	if err := s.Build(t.Context(), "mcp-gateway"); err != nil {
		t.Fatal(err)
	}
	root, err := s.Resolve("mcp-gateway")
	if err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(root, "usr/local/bin/mcp-gateway")); err != nil || target != "/.fence/fence" {
		t.Errorf("usr/local/bin/mcp-gateway -> %q, %v; want /.fence/fence", target, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/mcp-gateway")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("etc/mcp-gateway: %v, %v; want a 0700 directory", fi, err)
	}
	if _, err := os.Stat(filepath.Join(root, "bin/busybox")); err != nil {
		t.Errorf("base's files are not in mcp-gateway: %v", err)
	}
}
