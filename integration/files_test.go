package integration

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"mime/multipart"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestFiles proves the filesystem API end to end through the daemon: a
// binary round trip, listing, directories and removal. Root: the daemon
// creates namespaces, cgroups and mounts.
func TestFiles(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	e := sb.Envd()
	ctx := ctxT(t)

	content := make([]byte, 1<<20+17)
	rand.Read(content)
	if err := e.WriteFile(ctx, "/home/user/dir/sub/f.bin", bytes.NewReader(content)); err != nil {
		t.Fatalf("WriteFile (with missing parents): %v", err)
	}
	rc, err := e.ReadFile(ctx, "/home/user/dir/sub/f.bin")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("ReadFile after WriteFile: %d bytes, %v; want the %d bytes written", len(got), err, len(content))
	}
	// Relative paths are from the user's home.
	if rc, err := e.ReadFile(ctx, "dir/sub/f.bin"); err != nil {
		t.Errorf("ReadFile(relative): %v", err)
	} else {
		n, _ := io.Copy(io.Discard, rc)
		rc.Close()
		if n != int64(len(content)) {
			t.Errorf("ReadFile(relative) = %d bytes, want %d", n, len(content))
		}
	}
	// What the process API sees is what the file API wrote.
	if out := sh(t, e, "wc -c < /home/user/dir/sub/f.bin; stat -c %U /home/user/dir/sub/f.bin"); out != "1048593\nuser\n" {
		t.Errorf("size and owner of the uploaded file seen inside = %q, want 1048593 and user", out)
	}
	st, err := e.Stat(ctx, "/home/user/dir/sub/f.bin")
	if err != nil || st.Type != client.TypeFile || st.Size != int64(len(content)) || st.Name != "f.bin" || st.Owner != "user" {
		t.Errorf("Stat = %+v, %v; want file f.bin of %d bytes owned by user", st, err, len(content))
	}
	ents, err := e.ListDir(ctx, "/home/user/dir", 2)
	if err != nil {
		t.Fatalf("ListDir: %v", err)
	}
	var paths []string
	for _, en := range ents {
		paths = append(paths, en.Path)
	}
	slices.Sort(paths)
	if want := []string{"/home/user/dir/sub", "/home/user/dir/sub/f.bin"}; !slices.Equal(paths, want) {
		t.Errorf("ListDir(/home/user/dir, 2) = %q, want %q", paths, want)
	}
	md, err := e.MakeDir(ctx, "/home/user/newdir/a/b")
	if err != nil || md.Type != client.TypeDir {
		t.Errorf("MakeDir = %+v, %v; want a directory", md, err)
	}
	if _, err := e.MakeDir(ctx, "/home/user/newdir/a/b"); !errors.Is(err, api.ErrConflict) {
		t.Errorf("MakeDir of an existing directory = %v, want conflict", err)
	}
	if _, err := e.Move(ctx, "/home/user/dir/sub/f.bin", "/home/user/newdir/moved.bin"); err != nil {
		t.Errorf("Move: %v", err)
	}
	if err := e.Remove(ctx, "/home/user/dir"); err != nil {
		t.Errorf("Remove: %v", err)
	}
	if _, err := e.Stat(ctx, "/home/user/dir"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Stat after Remove = %v, want not found", err)
	}
	if st, err := e.Stat(ctx, "/home/user/newdir/moved.bin"); err != nil || st.Size != int64(len(content)) {
		t.Errorf("Stat of the moved file = %+v, %v", st, err)
	}
	if _, err := e.ReadFile(ctx, "/no/such/file"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("ReadFile(missing) = %v, want not found", err)
	}
	// Like envd, uploads are chowned to the selected user.
	if err := e.WithUser("root").WriteFile(ctx, "/root/x", strings.NewReader("x")); err != nil {
		t.Errorf("WriteFile /root/x as root: %v", err)
	}
	if out := sh(t, e.WithUser("root"), "stat -c %U /root/x"); out != "root\n" {
		t.Errorf("owner of /root/x uploaded as root = %q, want root", out)
	}
}

// TestFilesConfinement proves that the file API cannot reach the host:
// path traversal, symlinks created inside the sandbox that point at host
// paths or at /proc/1/root, for download and upload. A canary file with
// random content on the host must never come back or change. Root: the
// daemon creates namespaces, cgroups and mounts.
func TestFilesConfinement(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	e := sb.Envd()
	root := e.WithUser("root")
	ctx := ctxT(t)

	secret := "canary-" + randHex(16)
	canary := filepath.Join(os.TempDir(), "fence-canary-"+randHex(6))
	if err := os.WriteFile(canary, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(canary) })
	// A second canary inside the daemon's data dir, which sandbox uids can
	// traverse on the host.
	dataCanary := filepath.Join(d.DataDir, "canary")
	if err := os.WriteFile(dataCanary, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	hostShadow, _ := os.ReadFile("/etc/shadow")

	leaks := func(b []byte) bool {
		return bytes.Contains(b, []byte(secret)) || (len(hostShadow) > 0 && bytes.Contains(b, hostShadow))
	}
	download := func(t *testing.T, ee *client.Envd, p string) {
		t.Helper()
		rc, err := ee.ReadFile(ctx, p)
		if err != nil {
			return // refused or not found: fine
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if leaks(b) {
			t.Errorf("ReadFile(%q) returned host content (%q)", p, b)
		}
	}
	rel := strings.Repeat("../", 12)
	paths := []string{
		canary,
		rel + strings.TrimPrefix(canary, "/"),
		"/" + rel + strings.TrimPrefix(canary, "/"),
		"/home/user/" + rel + strings.TrimPrefix(canary, "/"),
		dataCanary,
		rel + strings.TrimPrefix(dataCanary, "/"),
		"/proc/1/root" + canary,
		"/proc/self/root" + canary,
		"/proc/1/cwd/" + rel + strings.TrimPrefix(canary, "/"),
		"/etc/shadow",
		rel + "etc/shadow",
		"/proc/1/root/etc/shadow",
	}
	t.Run("traversal", func(t *testing.T) {
		for _, p := range paths {
			download(t, e, p)
			download(t, root, p)
		}
		// Raw, unencoded traversal in the query and in the URL path.
		hdr := map[string]string{api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: "49983", api.HeaderAccessToken: sb.EnvdAccessToken}
		for _, raw := range []string{
			"/files?path=../../../../../../.." + canary + "&username=root",
			"/files?path=%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e" + url.QueryEscape(canary) + "&username=root",
			"/files/../../../../.." + canary + "?path=" + url.QueryEscape(canary) + "&username=root",
			"/files?path=/proc/1/root/../../../../.." + canary + "&username=root",
		} {
			r := d.do(t, "GET", raw, "", nil, hdr)
			if leaks(r.Body) {
				t.Errorf("GET %s returned the host canary (status %d)", raw, r.Status)
			}
		}
	})
	t.Run("symlink download", func(t *testing.T) {
		sh(t, root, strings.Join([]string{
			"ln -s " + canary + " /home/user/l1",
			"ln -s " + rel + strings.TrimPrefix(canary, "/") + " /home/user/l2",
			"ln -s /proc/1/root" + canary + " /home/user/l3",
			"ln -s " + dataCanary + " /home/user/l4",
			"ln -s /proc/1/root/../../../.." + canary + " /home/user/l5",
			"mkdir -p /home/user/d && ln -s / /home/user/d/rootlink",
		}, " && "))
		for _, p := range []string{"/home/user/l1", "/home/user/l2", "/home/user/l3", "/home/user/l4", "/home/user/l5", "/home/user/d/rootlink" + canary} {
			download(t, e, p)
			download(t, root, p)
		}
		// Nor does anything inside see it.
		out, _, _ := run(t, root, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "cat /home/user/l1 /home/user/l3 /home/user/l4 " + canary + " " + dataCanary + " 2>/dev/null; true"}})
		if strings.Contains(out, secret) {
			t.Errorf("the host canary is readable inside the sandbox: %q", out)
		}
	})
	t.Run("symlink upload", func(t *testing.T) {
		sh(t, root, strings.Join([]string{
			"ln -s " + canary + " /home/user/w1",
			"ln -s /proc/1/root" + canary + " /home/user/w2",
			"ln -s " + dataCanary + " /home/user/w3",
			"ln -s " + filepath.Dir(canary) + " /home/user/wdir",
		}, " && "))
		for _, p := range []string{"/home/user/w1", "/home/user/w2", "/home/user/w3", "/home/user/wdir/" + filepath.Base(canary), canary, rel + strings.TrimPrefix(canary, "/"), dataCanary} {
			for _, ee := range []*client.Envd{e, root} {
				_ = ee.WriteFile(ctx, p, strings.NewReader("pwned"))
			}
		}
		for _, f := range []string{canary, dataCanary} {
			if b, err := os.ReadFile(f); err != nil || string(b) != secret {
				t.Errorf("host file %s after uploads through symlinks = %q, %v; want it unchanged", f, b, err)
			}
		}
		// Remove and Move through symlinks leave the host alone too.
		for _, p := range []string{"/home/user/w1/..", "/home/user/wdir/" + filepath.Base(canary), canary, dataCanary} {
			_ = root.Remove(ctx, p)
		}
		_, _ = root.Move(ctx, "/home/user/wdir/"+filepath.Base(canary), "/home/user/stolen")
		for _, f := range []string{canary, dataCanary} {
			if b, err := os.ReadFile(f); err != nil || string(b) != secret {
				t.Errorf("host file %s after Remove/Move through symlinks = %q, %v; want it unchanged", f, b, err)
			}
		}
	})
	t.Run("access tokens", func(t *testing.T) {
		other := d.create(t, api.NewSandbox{TemplateID: "minimal"})
		if err := other.Envd().WriteFile(ctx, "/tmp/other-secret", strings.NewReader(secret)); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name, token string
		}{
			{"no token", ""},
			{"wrong token", "not-the-token"},
			{"token of another sandbox", sb.EnvdAccessToken},
		} {
			hdr := map[string]string{api.HeaderSandboxID: other.ID(), api.HeaderSandboxPort: "49983"}
			if tc.token != "" {
				hdr[api.HeaderAccessToken] = tc.token
			}
			r := d.do(t, "GET", "/files?path=/tmp/other-secret&username=root", "", nil, hdr)
			if r.Status < 400 || r.Status >= 500 || leaks(r.Body) {
				t.Errorf("%s: GET /files of another sandbox = %d %q, want 401/403", tc.name, r.Status, r.Body)
			}
		}
		// The control-plane API key is no envd token either.
		hdr := map[string]string{api.HeaderSandboxID: other.ID(), api.HeaderSandboxPort: "49983"}
		if r := d.do(t, "GET", "/files?path=/tmp/other-secret&username=root", d.Key, nil, hdr); r.Status < 400 || leaks(r.Body) {
			t.Errorf("GET /files with only the API key = %d %q, want refused", r.Status, r.Body)
		}
	})
}

// TestFilesMissingParentsOutsideHome proves that, as with envd, a write
// or mkdir as user `user` to a path whose parents are missing outside the
// user's home (/0/sub/f: a new top-level directory) succeeds and leaves
// the parents and the file owned by the user, for a raw upload, a
// multipart upload of several files and MakeDir; and that a symlink the
// user planted on the path (/tmp/x -> /etc) is never followed to create
// anything where the user could not. On native and on gvisor (whose
// kernel has no setfsuid: the agent takes the user's IDs otherwise).
// Root: namespaces, cgroups, mounts (and runsc).
func TestFilesMissingParentsOutsideHome(t *testing.T) {
	t.Run("native", func(t *testing.T) { testFilesMissingParents(t, "minimal", nil) })
	t.Run("gvisor", func(t *testing.T) {
		testutil.RequireRunsc(t)
		testFilesMissingParents(t, "base", gvisorMeta)
	})
}

func testFilesMissingParents(t *testing.T, tmpl string, meta map[string]string) {
	requireTemplate(t, tmpl)
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: tmpl, Metadata: meta})
	e := sb.Envd().WithUser("user")
	ctx := ctxT(t)

	if err := e.WriteFile(ctx, "/0/sub/f", strings.NewReader("one")); err != nil {
		t.Fatalf("WriteFile(/0/sub/f) as user: %v", err)
	}
	// The SDK's files.write([...]): one multipart request of several files.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, p := range []string{"/1/multi_test_file0.txt", "/1/deeper/multi_test_file1.txt"} {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+p+`"`)
		h.Set("Content-Type", "application/octet-stream")
		w, _ := mw.CreatePart(h)
		io.WriteString(w, "multi")
	}
	mw.Close()
	hdr := map[string]string{api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: "49983",
		api.HeaderAccessToken: sb.EnvdAccessToken, "Content-Type": mw.FormDataContentType()}
	if r := d.do(t, "POST", "/files?username=user", "", &body, hdr); r.Status != 200 {
		t.Fatalf("multipart POST /files of two files with missing parents as user = %d %s, want 200", r.Status, r.Body)
	}
	if _, err := e.MakeDir(ctx, "/2/a/b"); err != nil {
		t.Errorf("MakeDir(/2/a/b) as user: %v", err)
	}
	const owners = "/0 /0/sub /0/sub/f /1 /1/multi_test_file0.txt /1/deeper /1/deeper/multi_test_file1.txt /2 /2/a /2/a/b"
	want := strings.Repeat("user\n", len(strings.Fields(owners)))
	if got := sh(t, e.WithUser("root"), "stat -c %U "+owners); got != want {
		t.Errorf("owners of %s = %q, want user for each", owners, got)
	}
	if got := sh(t, e, "cat /0/sub/f /1/deeper/multi_test_file1.txt"); got != "onemulti" {
		t.Errorf("content = %q, want onemulti", got)
	}

	// A symlink the user planted: the agent creates nothing through it.
	sh(t, e, "ln -s /etc /tmp/x")
	if err := e.WriteFile(ctx, "/tmp/x/new/f", strings.NewReader("evil")); !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("WriteFile(/tmp/x/new/f) through the user's /tmp/x -> /etc = %v, want permission denied", err)
	}
	if _, err := e.MakeDir(ctx, "/tmp/x/new2"); err == nil {
		t.Errorf("MakeDir(/tmp/x/new2) through the user's /tmp/x -> /etc succeeded")
	}
	if got := sh(t, e.WithUser("root"), "ls -d /etc/new /etc/new2 2>/dev/null; true"); got != "" {
		t.Errorf("created through the user's symlink: %q", got)
	}
	// Nor below a directory the user may not search.
	if err := e.WriteFile(ctx, "/root/new/f", strings.NewReader("x")); err == nil {
		t.Errorf("WriteFile(/root/new/f) as user succeeded")
	}
	if got := sh(t, e.WithUser("root"), "ls -d /root/new 2>/dev/null; true"); got != "" {
		t.Errorf("created below /root for user: %q", got)
	}
}
