package contentreg_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/contentreg"
	"github.com/google/go-containerregistry/pkg/registry"
	"golang.org/x/sys/unix"
)

// needRoot skips a test that sets owners, devices and trusted.* attributes
// unless it runs as root (it never skips in CI, which runs as root).
func needRoot(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true needs root")
		}
		t.Skip("needs root")
	}
}

// serve starts go-containerregistry's in-process registry on loopback,
// with wrap (if not nil) in front of it.
func serve(t *testing.T, wrap func(h http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func newRegistry(t *testing.T, host string, opts contentreg.Options) *contentreg.Registry {
	t.Helper()
	opts.URL = host + "/fence"
	r, err := contentreg.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// makeTree writes a tree with every kind of entry PushTree keeps.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(dir, "etc/empty"), 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, "opaque/sub"), 0o700))
	must(t, os.WriteFile(filepath.Join(dir, "etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(t, os.Chown(filepath.Join(dir, "suid"), 1000, 1001))
	must(t, unix.Chmod(filepath.Join(dir, "suid"), 0o4755))
	must(t, os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600))
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	must(t, os.WriteFile(filepath.Join(dir, "big"), big, 0o644))
	must(t, os.Link(filepath.Join(dir, "big"), filepath.Join(dir, "etc/big-link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "abs-link")))
	must(t, os.Symlink("etc", filepath.Join(dir, "dir-link")))
	must(t, os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	must(t, unix.Lchown(filepath.Join(dir, "dangling"), 7, 8))
	must(t, unix.Mknod(filepath.Join(dir, "whiteout"), unix.S_IFCHR, 0)) // an overlay whiteout: mode 0, device 0/0
	must(t, unix.Mknod(filepath.Join(dir, "fifo"), unix.S_IFIFO|0o640, 0))
	must(t, unix.Setxattr(filepath.Join(dir, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(t, unix.Setxattr(filepath.Join(dir, "etc/hosts"), "user.note", []byte("a\x00binary\nvalue"), 0))
	must(t, unix.Setxattr(filepath.Join(dir, "etc/hosts"), "trusted.overlay.origin", []byte{0, 1, 2, 0xff}, 0))
	must(t, os.Chown(filepath.Join(dir, "opaque/sub"), 65534, 65534))
	must(t, unix.Chmod(filepath.Join(dir, "opaque/sub"), 0o1777))
	mt := time.Date(2021, 2, 3, 4, 5, 6, 789, time.UTC)
	for _, p := range []string{"etc/hosts", "etc", "opaque/sub", "."} {
		must(t, os.Chtimes(filepath.Join(dir, p), mt, mt))
	}
	must(t, unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, "dangling"),
		[]unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW))
}

// describe lists every entry of the tree at dir with what PushTree must
// keep: type, mode, owner, device, mtime, size, content hash, symlink
// target, extended attributes, and which entries share an inode.
func describe(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	inodes := map[uint64]string{}
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s mode=%o uid=%d gid=%d rdev=%d", rel, st.Mode, st.Uid, st.Gid, st.Rdev)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" size=%d sha=%x mtime=%d", st.Size, sha256.Sum256(b), st.Mtim.Nano())
			if first, ok := inodes[st.Ino]; ok {
				line += " same-inode-as=" + first
			} else {
				inodes[st.Ino] = rel
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" -> %s mtime=%d", target, st.Mtim.Nano())
		default:
			line += fmt.Sprintf(" mtime=%d", st.Mtim.Nano())
		}
		sz, _ := unix.Llistxattr(p, nil)
		if sz > 0 {
			buf := make([]byte, sz)
			n, _ := unix.Llistxattr(p, buf)
			names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
			sort.Strings(names)
			for _, name := range names {
				v := make([]byte, 4096)
				m, err := unix.Lgetxattr(p, name, v)
				if err != nil {
					return err
				}
				line += fmt.Sprintf(" %s=%q", name, v[:m])
			}
		}
		lines = append(lines, line)
		return nil
	})
	must(t, err)
	return strings.Join(lines, "\n")
}

func TestTreeRoundTripsExactly(t *testing.T) {
	needRoot(t)
	host := serve(t, nil)
	r := newRegistry(t, host, contentreg.Options{})
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	must(t, os.Mkdir(src, 0o751))
	makeTree(t, src)
	want := describe(t, src)
	for _, s := range []string{"trusted.overlay.opaque", "same-inode-as=big", "whiteout mode=20000", "-> /etc/passwd", "suid mode=104755 uid=1000 gid=1001"} {
		if !strings.Contains(want, s) {
			t.Fatalf("the test tree lacks %q:\n%s", s, want)
		}
	}

	meta := []byte(`{"name":"t"}`)
	digest, err := r.PushTree(ctx, "templates/t", "v1", src, meta)
	must(t, err)
	if !strings.HasPrefix(digest, "sha256:") || len(digest) != 71 {
		t.Fatalf("digest %q", digest)
	}
	again, err := r.PushTree(ctx, "templates/t", "v1", src, meta)
	must(t, err)
	if again != digest {
		t.Errorf("the same tree pushed twice has digests %s and %s", digest, again)
	}

	dst := filepath.Join(t.TempDir(), "dst")
	got, err := r.PullTree(ctx, "templates/t", digest, dst)
	must(t, err)
	if !bytes.Equal(got, meta) {
		t.Errorf("meta %q, want %q", got, meta)
	}
	if d := describe(t, dst); d != want {
		t.Errorf("pulled tree differs:\n got:\n%s\nwant:\n%s", d, want)
	}

	if _, err := r.PullTree(ctx, "templates/t", digest, dst); !errors.Is(err, fs.ErrExist) {
		t.Errorf("pull into an existing dir: %v, want fs.ErrExist", err)
	}
}

// tamper serves, for the GETs whose path contains match, the registry's
// answer with one byte changed (or replaced by other if not nil).
func tamper(match string, other []byte) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method != http.MethodGet || match == "" || !strings.Contains(req.URL.Path, match) {
				h.ServeHTTP(w, req)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			b := rec.Body.Bytes()
			if other != nil {
				b = other
			} else if len(b) > 0 {
				b[len(b)/2] ^= 0x20
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.Header().Del("Content-Length")
			w.WriteHeader(rec.Code)
			w.Write(b)
		})
	}
}

func TestTamperedContentIsRefused(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "src")
	must(t, os.Mkdir(src, 0o755))
	makeTree(t, src)

	// Push through an honest front, then pull through one that changes
	// the bytes of the layer, of the manifest, or of the meta.
	type how struct {
		match string
		other []byte
	}
	var now atomic.Pointer[how]
	now.Store(&how{})
	host := serve(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			c := now.Load()
			tamper(c.match, c.other)(h).ServeHTTP(w, req)
		})
	})
	r := newRegistry(t, host, contentreg.Options{})
	digest, err := r.PushTree(ctx, "templates/t", "v1", src, []byte(`{"meta":"data"}`))
	must(t, err)
	otherDigest, err := r.PushTree(ctx, "templates/u", "v1", filepath.Join(src, "etc"), []byte(`{}`))
	must(t, err)
	om := get(t, "http://"+host+"/v2/fence/templates/u/manifests/"+otherDigest)
	var m struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	must(t, json.Unmarshal(get(t, "http://"+host+"/v2/fence/templates/t/manifests/"+digest), &m))

	for _, tc := range []struct {
		name  string
		match string
		other []byte
	}{
		{"layer", "/blobs/" + m.Layers[0].Digest, nil},
		{"meta", "/blobs/" + m.Config.Digest, nil},
		{"layer swapped for another", "/blobs/" + m.Layers[0].Digest, om},
		{"manifest", "/manifests/", nil},
		{"manifest swapped for another image's", "/manifests/", om},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now.Store(&how{tc.match, tc.other})
			defer now.Store(&how{})
			parent := t.TempDir()
			dst := filepath.Join(parent, "dst")
			_, err := r.PullTree(ctx, "templates/t", digest, dst)
			if !errors.Is(err, contentreg.ErrDigestMismatch) {
				t.Fatalf("pull of tampered content: %v, want ErrDigestMismatch", err)
			}
			left, _ := os.ReadDir(parent)
			if len(left) != 0 {
				t.Errorf("a refused pull left %v in %s", left, parent)
			}
		})
	}
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	must(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	return b
}

func TestAuthAndTransport(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644))
	host := serve(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if u, p, ok := req.BasicAuth(); !ok || u != "fence" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			if redirectOff.Load() && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/") {
				http.Redirect(w, req, "http://192.0.2.1/elsewhere", http.StatusTemporaryRedirect)
				return
			}
			h.ServeHTTP(w, req)
		})
	})
	anon := newRegistry(t, host, contentreg.Options{})
	if _, err := anon.PushTree(ctx, "t", "v1", src, nil); err == nil {
		t.Fatal("push without credentials to a registry that wants them succeeded")
	}
	r := newRegistry(t, host, contentreg.Options{Username: "fence", Password: "s3cret"})
	digest, err := r.PushTree(ctx, "t", "v1", src, nil)
	must(t, err)
	_, err = r.PullTree(ctx, "t", digest, filepath.Join(t.TempDir(), "d"))
	must(t, err)

	// A redirect to a host off the loopback address is refused before
	// any packet is sent to it.
	redirectOff.Store(true)
	defer redirectOff.Store(false)
	parent := t.TempDir()
	_, err = r.PullTree(ctx, "t", digest, filepath.Join(parent, "d"))
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("pull redirected off the loopback address: %v, want a refusal", err)
	}
	if left, _ := os.ReadDir(parent); len(left) != 0 {
		t.Errorf("a refused pull left %v", left)
	}
}

var redirectOff atomic.Bool

func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []contentreg.Options{
		{URL: ""},
		{URL: "https://registry.example/fence"},
		{URL: "/fence"},
		{URL: "Registry Example/fence"},
		{URL: "registry.example/UPPER"},
		{URL: "registry.example/fence", Username: "u"},
		{URL: "registry.example/fence", CAFile: "/nonexistent/ca.pem"},
	} {
		if _, err := contentreg.New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	for _, u := range []string{"127.0.0.1:5000/fence", "registry.example", "[::1]:5000/a/b", "localhost:5000/x/"} {
		r, err := contentreg.New(contentreg.Options{URL: u})
		if err != nil {
			t.Errorf("New(%q): %v", u, err)
			continue
		}
		if r.URL() != strings.TrimSuffix(u, "/") {
			t.Errorf("New(%q).URL() = %q", u, r.URL())
		}
	}
	r, err := contentreg.New(contentreg.Options{URL: "127.0.0.1:1/fence"})
	must(t, err)
	for _, repo := range []string{"", "/x", "x/", "X"} {
		if _, err := r.PushTree(context.Background(), repo, "v1", t.TempDir(), nil); err == nil {
			t.Errorf("PushTree to repository %q accepted", repo)
		}
	}
	for _, d := range []string{"", "sha256:abc", "md5:" + strings.Repeat("0", 32)} {
		if _, err := r.PullTree(context.Background(), "x", d, filepath.Join(t.TempDir(), "d")); err == nil {
			t.Errorf("PullTree of digest %q accepted", d)
		}
	}
}
