package oci_test

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/oci"
	. "github.com/fencesandbox/fence/internal/oci/ocitest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// testImage is a three-layer image that exercises what a layer can do:
// whiteouts, opaque directories, hard links within and across layers,
// symlinks (kept as data, also ones pointing out of the root), set-id
// bits, device nodes, FIFOs, xattrs and file capabilities, owners, and a
// directory reached through a lower layer's symlink.
func testImage(t *testing.T) v1.Image {
	owned := File("data/owned", 0o640, "owned\n")
	owned.Hdr.Uid, owned.Hdr.Gid = 1234, 5678
	suid := File("bin/suid", 0o4755, "#!/bin/sh\n")
	sgidDir := Dir("srv/", 0o2775)
	char := Entry{Hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/evilnull", Mode: 0o666, Devmajor: 1, Devminor: 3}}
	block := Entry{Hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "data/sda", Mode: 0o660, Devmajor: 8, Devminor: 0}}
	fifo := Entry{Hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "data/fifo", Mode: 0o644}}
	capped := File("bin/capped", 0o755, "cap\n")
	capped.Hdr.PAXRecords = map[string]string{
		"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
		"SCHILY.xattr.user.note":           "hello",
	}
	l1 := Layer(t,
		Dir("bin/", 0o755), Dir("etc/", 0o755), Dir("usr/", 0o755), Dir("usr/lib/", 0o755), Dir("data/", 0o755),
		Dir("etc/opq/", 0o755), File("etc/opq/a", 0o644, "a"), File("etc/opq/b", 0o644, "b"),
		File("etc/gone", 0o644, "gone"), File("etc/keep", 0o644, "keep"),
		Symlink("lib", "usr/lib"), File("usr/lib/libx.so", 0o644, "libx"),
		File("data/hard1", 0o644, "shared inode\n"), Link("data/hard2", "data/hard1"),
		owned, suid, sgidDir, char, block, fifo, capped,
		Symlink("abs", "/etc/passwd"), Symlink("climb", "../../../../../../etc/shadow"),
	)
	l2 := Layer(t,
		Dir("etc/", 0o755), File("etc/.wh.gone", 0o644, ""),
		Dir("etc/opq/", 0o755), File("etc/opq/.wh..wh..opq", 0o644, ""), File("etc/opq/c", 0o644, "c"),
		Link("data/hard3", "data/hard1"),
		// No "lib/" entry: the file goes where the lower layer's lib
		// symlink leads.
		File("lib/newfile", 0o644, "through the symlink\n"),
		File("etc/keep", 0o600, "keep v2\n"),
	)
	l3 := Layer(t, Dir("etc/", 0o755), File("etc/.wh.opq", 0o644, ""), File("top", 0o644, "top\n"))
	return Image(t, v1.Config{Env: []string{"PATH=/bin", "FOO=bar"}, WorkingDir: "/data", User: "1000:1000"}, l1, l2, l3)
}

func newCache(t *testing.T) *oci.Cache {
	c, err := oci.NewCache(filepath.Join(t.TempDir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mkdst(t *testing.T, c *oci.Cache) string {
	// On the cache's filesystem, so that files are hard links.
	d, err := os.MkdirTemp(filepath.Dir(c.Dir()), "rootfs-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// checkTestImage checks dst against testImage.
func checkTestImage(t *testing.T, dst string) {
	t.Helper()
	if exists(filepath.Join(dst, "etc/gone")) {
		t.Error("etc/gone survived its whiteout")
	}
	if exists(filepath.Join(dst, "etc/opq")) {
		t.Error("etc/opq survived the top layer's whiteout")
	}
	if got := readFile(t, filepath.Join(dst, "etc/keep")); got != "keep v2\n" {
		t.Errorf("etc/keep = %q, want the upper layer's", got)
	}
	h1 := ino(t, filepath.Join(dst, "data/hard1"))
	if ino(t, filepath.Join(dst, "data/hard2")) != h1 || ino(t, filepath.Join(dst, "data/hard3")) != h1 {
		t.Error("data/hard2 or data/hard3 (a hard link to a lower layer's file) is not a hard link to data/hard1")
	}
	if l, err := os.Readlink(filepath.Join(dst, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("lib = %q, %v; want the symlink to usr/lib kept", l, err)
	}
	if got := readFile(t, filepath.Join(dst, "usr/lib/newfile")); got != "through the symlink\n" {
		t.Errorf("usr/lib/newfile = %q", got)
	}
	for link, want := range map[string]string{"abs": "/etc/passwd", "climb": "../../../../../../etc/shadow"} {
		if l, err := os.Readlink(filepath.Join(dst, link)); err != nil || l != want {
			t.Errorf("%s = %q, %v; want a symlink to %q kept as data", link, l, err, want)
		}
	}
	fi, err := os.Stat(filepath.Join(dst, "bin/suid"))
	if err != nil || fi.Mode() != 0o755 {
		t.Errorf("bin/suid mode = %v, %v; want 0755 without set-uid", fi.Mode(), err)
	}
	fi, err = os.Stat(filepath.Join(dst, "srv"))
	if err != nil || fi.Mode() != fs.ModeDir|0o775 {
		t.Errorf("srv mode = %v, %v; want 0775 without set-gid", fi.Mode(), err)
	}
	for _, p := range []string{"dev/evilnull", "data/sda", "data/fifo"} {
		if exists(filepath.Join(dst, p)) {
			t.Errorf("%s (a device node or FIFO) was extracted", p)
		}
	}
	for _, x := range []string{"security.capability", "user.note"} {
		if _, err := unix.Lgetxattr(filepath.Join(dst, "bin/capped"), x, make([]byte, 64)); !errors.Is(err, unix.ENODATA) {
			t.Errorf("bin/capped xattr %s: %v, want none (ENODATA)", x, err)
		}
	}
	st, err := os.Lstat(filepath.Join(dst, "data/owned"))
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Sys().(*syscall.Stat_t); s.Uid != 1234 || s.Gid != 5678 || st.Mode() != 0o640 {
		t.Errorf("data/owned = %d:%d %v, want 1234:5678 0640", s.Uid, s.Gid, st.Mode())
	}
	if !st.ModTime().Equal(ModTime) {
		t.Errorf("data/owned mtime = %v, want %v", st.ModTime(), ModTime)
	}
	if readFile(t, filepath.Join(dst, "top")) != "top\n" {
		t.Error("top layer's file missing")
	}
}

// TestUnpack pulls a three-layer image from a registry on the loopback
// address and checks every rule of layer application; a second pull into
// another tree downloads no layer blob and shares the first tree's inodes.
func TestUnpack(t *testing.T) {
	testutil.RequireRoot(t) // owners are kept
	reg := NewRegistry(t)
	img := testImage(t)
	ref := reg.Push(t, "test/img:1", img)
	c := newCache(t)

	dst := mkdst(t, c)
	got, err := c.Unpack(t.Context(), ref, dst, oci.Options{Progress: testWriter{t}})
	if err != nil {
		t.Fatalf("Unpack: %v", err)
	}
	checkTestImage(t, dst)
	want, _ := img.Digest()
	if got.Digest != want.String() || len(got.Layers) != 3 || got.Config.WorkingDir != "/data" || got.Config.User != "1000:1000" ||
		strings.Join(got.Config.Env, " ") != "PATH=/bin FOO=bar" {
		t.Errorf("Unpack = %+v, want digest %s, 3 layers and the image's config", got, want)
	}

	layers, _ := img.Layers()
	for i, l := range layers {
		d, _ := l.Digest()
		if n := reg.BlobGets(d); n != 1 {
			t.Errorf("layer %d fetched %d times by the first pull, want 1", i, n)
		}
	}
	dst2 := mkdst(t, c)
	if _, err := c.Unpack(t.Context(), ref, dst2, oci.Options{}); err != nil {
		t.Fatalf("second Unpack: %v", err)
	}
	checkTestImage(t, dst2)
	for i, l := range layers {
		d, _ := l.Digest()
		if n := reg.BlobGets(d); n != 1 {
			t.Errorf("layer %d fetched again by the second pull (%d downloads): the cache missed", i, n)
		}
	}
	if ino(t, filepath.Join(dst, "etc/keep")) != ino(t, filepath.Join(dst2, "etc/keep")) {
		t.Error("two trees of one image do not share the cached file's inode")
	}
	if _, err := c.Unpack(t.Context(), ref, dst2, oci.Options{}); err == nil {
		t.Error("Unpack into a non-empty directory succeeded")
	}
	// Copy: a tree of its own files, hard links within it kept.
	dst3 := mkdst(t, c)
	if _, err := c.Unpack(t.Context(), ref, dst3, oci.Options{Copy: true}); err != nil {
		t.Fatalf("Unpack(Copy): %v", err)
	}
	checkTestImage(t, dst3)
	if ino(t, filepath.Join(dst, "etc/keep")) == ino(t, filepath.Join(dst3, "etc/keep")) {
		t.Error("Unpack(Copy) linked the cached file")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// cacheState lists the cache's entries (layers and work directories).
func cacheState(t *testing.T, c *oci.Cache) []string {
	entries, err := os.ReadDir(c.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Name() != ".lock" {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestHostileImages pulls images whose layers try to write outside the
// tree (names with "..", hard links out, files written through a symlink
// to a host directory, in one layer or across two), lie about their
// content, or exceed a limit. Each fails with ErrInvalidImage, the host
// directory stays untouched, dst is left empty, and no bad layer enters
// the cache.
func TestHostileImages(t *testing.T) {
	testutil.RequireRoot(t)
	host := t.TempDir() // a host directory the layers aim at
	if err := os.WriteFile(filepath.Join(host, "victim"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	climb := strings.Repeat("../", 20) + strings.TrimPrefix(host, "/")
	good := Layer(t, Dir("etc/", 0o755), File("etc/ok", 0o644, "ok"))
	tests := []struct {
		name   string
		img    func() v1.Image
		opts   oci.Options
		errHas string
		// ok: the image is accepted, the hostile part made harmless.
		ok bool
	}{
		{"dot-dot name", func() v1.Image {
			return Image(t, v1.Config{}, good, Layer(t, File(climb+"/pwned", 0o644, "x")))
		}, oci.Options{}, "climbs out", false},
		{"dot-dot inside a name", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, File("etc/../../../"+climb+"/pwned", 0o644, "x")))
		}, oci.Options{}, "climbs out", false},
		{"hard link out", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Link("stolen", climb+"/victim")))
		}, oci.Options{}, "climbs out", false},
		{"hard link to a missing file", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Link("stolen", "nowhere/victim")))
		}, oci.Options{}, "no layer has", false},
		{"file through an absolute symlink, one layer", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Symlink("evil", host), File("evil/pwned", 0o644, "x")))
		}, oci.Options{}, "", false},
		{"file through a climbing symlink, one layer", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Symlink("evil", climb), File("evil/pwned", 0o644, "x")))
		}, oci.Options{}, "", false},
		// The upper layer needs a directory where the lower one has a link
		// leading out: the link is replaced by a directory, inside.
		{"file through a lower layer's absolute symlink", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Symlink("evil", host)), Layer(t, File("evil/pwned", 0o644, "x")))
		}, oci.Options{}, "", true},
		{"hard link through a lower layer's symlink", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Symlink("evil", climb)), Layer(t, Link("stolen", "evil/victim")))
		}, oci.Options{}, "", false},
		{"whiteout through a lower layer's symlink", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Symlink("evil", host)), Layer(t, File("evil/.wh.victim", 0o644, "")))
		}, oci.Options{}, "", false},
		{"diff_id that does not match the content", func() v1.Image {
			img := Image(t, v1.Config{}, good)
			cf, _ := img.ConfigFile()
			cf = cf.DeepCopy()
			cf.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
			img, err := mutate.ConfigFile(img, cf)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}, oci.Options{}, "not its diff_id", false},
		{"too many files", func() v1.Image {
			var es []Entry
			for i := range 50 {
				es = append(es, File(fmt.Sprintf("f%d", i), 0o644, "x"))
			}
			return Image(t, v1.Config{}, Layer(t, es...))
		}, oci.Options{MaxFiles: 20}, "more files than", false},
		{"too large", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, File("big", 0o644, strings.Repeat("x", 1<<20))))
		}, oci.Options{MaxBytes: 64 << 10}, "size limit", false},
		{"hard link to a directory", func() v1.Image {
			return Image(t, v1.Config{}, Layer(t, Dir("d/", 0o755), Link("l", "d")))
		}, oci.Options{}, "directory", false},
	}
	reg := NewRegistry(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t)
			ref := reg.Push(t, fmt.Sprintf("hostile/%d:1", i), tt.img())
			dst := mkdst(t, c)
			_, err := c.Unpack(t.Context(), ref, dst, tt.opts)
			t.Logf("Unpack: %v", err)
			switch {
			case tt.ok:
				if err != nil {
					t.Errorf("Unpack = %v, want success", err)
				} else if fi, err := os.Lstat(filepath.Join(dst, "evil")); err != nil || !fi.IsDir() || readFile(t, filepath.Join(dst, "evil/pwned")) != "x" {
					t.Errorf("evil = %v, %v; want a directory inside the tree holding pwned", fi, err)
				}
			case !errors.Is(err, oci.ErrInvalidImage) || !strings.Contains(err.Error(), tt.errHas):
				t.Errorf("Unpack = %v, want ErrInvalidImage mentioning %q", err, tt.errHas)
			default:
				if entries, _ := os.ReadDir(dst); len(entries) != 0 {
					t.Errorf("the failed unpack left %d entries in dst", len(entries))
				}
			}
			for _, e := range cacheState(t, c) {
				if strings.HasPrefix(e, ".tmp-") {
					t.Errorf("the failed unpack left work dir %s in the cache", e)
				}
			}
			entries, _ := os.ReadDir(host)
			if len(entries) != 1 || readFile(t, filepath.Join(host, "victim")) != "host\n" {
				t.Errorf("the host directory changed: %v", entries)
			}
		})
	}
}

// TestAuth pulls from registries that require basic auth and a bearer
// token obtained through the token flow, anonymous or with credentials.
func TestAuth(t *testing.T) {
	testutil.RequireRoot(t)
	img := Image(t, v1.Config{}, Layer(t, File("f", 0o644, "f")))

	t.Run("basic", func(t *testing.T) {
		reg := NewRegistry(t)
		ref := reg.Push(t, "auth/basic:1", img)
		reg.Authorize = func(w http.ResponseWriter, r *http.Request) bool {
			if u, p, ok := r.BasicAuth(); ok && u == "alice" && p == "s3cret" {
				return true
			}
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return false
		}
		c := newCache(t)
		if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{}); err == nil {
			t.Error("anonymous pull from a registry that requires basic auth succeeded")
		}
		if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{Auth: &oci.Auth{Username: "alice", Password: "wrong"}}); err == nil {
			t.Error("pull with a wrong password succeeded")
		}
		if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{Auth: &oci.Auth{Username: "alice", Password: "s3cret"}}); err != nil {
			t.Errorf("pull with basic auth: %v", err)
		}
	})

	t.Run("token flow", func(t *testing.T) {
		reg := NewRegistry(t)
		ref := reg.Push(t, "auth/token:1", img)
		var realm string
		reg.Authorize = func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/token" {
				tok := "anon-token"
				if u, p, ok := r.BasicAuth(); ok {
					if u != "bob" || p != "pw" {
						w.WriteHeader(http.StatusUnauthorized)
						return false
					}
					tok = "bob-token"
				}
				json.NewEncoder(w).Encode(map[string]string{"token": tok})
				return false
			}
			switch r.Header.Get("Authorization") {
			case "Bearer anon-token", "Bearer bob-token", "Bearer given-token":
				return true
			}
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="test"`, realm))
			w.WriteHeader(http.StatusUnauthorized)
			return false
		}
		realm = reg.URL() + "/token"
		c := newCache(t)
		if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{}); err != nil {
			t.Errorf("anonymous token flow: %v", err)
		}
		c = newCache(t)
		if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{Auth: &oci.Auth{Username: "bob", Password: "pw"}}); err != nil {
			t.Errorf("token flow with credentials: %v", err)
		}
		c = newCache(t)
		if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{Auth: &oci.Auth{Token: "given-token"}}); err != nil {
			t.Errorf("pull with a given bearer token: %v", err)
		}
		c = newCache(t)
		if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{Auth: &oci.Auth{Username: "bob", Password: "bad"}}); err == nil {
			t.Error("token flow with wrong credentials succeeded")
		}
	})
}

// TestPlainHTTPOnlyOnLoopback serves a plain-HTTP registry on the host's
// non-loopback address: a pull from it fails and no request reaches the
// registry (go-containerregistry alone would fall back to HTTP for a
// private address).
func TestPlainHTTPOnlyOnLoopback(t *testing.T) {
	var ip net.IP
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			ip = n.IP
			break
		}
	}
	if ip == nil {
		t.Skip("no non-loopback IPv4 address on this host")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(t)
	ref := reg.Push(t, "x/y:1", Image(t, v1.Config{}, Layer(t, File("f", 0o644, "f"))))
	var hits atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Redirect(w, r, reg.URL()+r.URL.Path, http.StatusTemporaryRedirect)
	}), ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := newCache(t)
	remoteRef := ln.Addr().String() + "/x/y:1"
	_, err = c.Unpack(t.Context(), remoteRef, mkdst(t, c), oci.Options{})
	t.Logf("Unpack(%s): %v", remoteRef, err)
	if err == nil || hits.Load() != 0 {
		t.Errorf("Unpack(%s) = %v with %d plain-HTTP requests served, want a failure and none", remoteRef, err, hits.Load())
	}
	if ip.IsPrivate() && (err == nil || !strings.Contains(err.Error(), "plain-HTTP")) {
		t.Errorf("Unpack(%s) = %v, want a refusal of plain HTTP", remoteRef, err)
	}
	// The same registry on the loopback address is fine.
	if _, err := c.Unpack(t.Context(), ref, mkdst(t, c), oci.Options{}); err != nil {
		t.Errorf("Unpack(%s): %v", ref, err)
	}
}

// TestImport reads the test image from an OCI layout directory and from a
// docker-save tarball, and shares the layers a pull already cached.
func TestImport(t *testing.T) {
	testutil.RequireRoot(t)
	img := testImage(t)
	dir := t.TempDir()

	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	other := Image(t, v1.Config{}, Layer(t, File("other", 0o644, "other")))
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "test:1"})); err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(other, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "other:1"})); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("example.com/test:1")
	tarPath := filepath.Join(dir, "saved.tar")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}

	c := newCache(t)
	if _, err := c.Import(t.Context(), filepath.Join(dir, "layout"), "", mkdst(t, c), oci.Options{}); err == nil {
		t.Error("Import of a two-image layout without a ref succeeded")
	}
	dst := mkdst(t, c)
	got, err := c.Import(t.Context(), filepath.Join(dir, "layout"), "test:1", dst, oci.Options{})
	if err != nil {
		t.Fatalf("Import(layout): %v", err)
	}
	checkTestImage(t, dst)
	want, _ := img.Digest()
	if got.Digest != want.String() {
		t.Errorf("Import(layout).Digest = %s, want %s", got.Digest, want)
	}

	dst2 := mkdst(t, c)
	got2, err := c.Import(t.Context(), tarPath, "", dst2, oci.Options{Progress: testWriter{t}})
	if err != nil {
		t.Fatalf("Import(docker save): %v", err)
	}
	checkTestImage(t, dst2)
	id, _ := img.ConfigName()
	if got2.Digest != id.String() {
		t.Errorf("Import(docker save).Digest = %s, want the image ID %s", got2.Digest, id)
	}
	if ino(t, filepath.Join(dst, "top")) != ino(t, filepath.Join(dst2, "top")) {
		t.Error("the layout and the tarball, one image, do not share cached layers")
	}
	if _, err := c.Import(t.Context(), filepath.Join(dir, "nothing"), "", mkdst(t, c), oci.Options{}); err == nil {
		t.Error("Import of a missing path succeeded")
	}
	junk := filepath.Join(dir, "junk.tar")
	os.WriteFile(junk, []byte("not a tar"), 0o644)
	if _, err := c.Import(t.Context(), junk, "", mkdst(t, c), oci.Options{}); !errors.Is(err, oci.ErrInvalidImage) {
		t.Errorf("Import(junk) = %v, want ErrInvalidImage", err)
	}
}

// TestGC unpacks two images sharing a base layer, then collects with only
// the first one's layers kept: the second's own layer goes, the trees
// already unpacked stay intact, and the second image unpacks again.
func TestGC(t *testing.T) {
	testutil.RequireRoot(t)
	reg := NewRegistry(t)
	base := Layer(t, Dir("etc/", 0o755), File("etc/base", 0o644, "base"))
	a := Image(t, v1.Config{}, base, Layer(t, File("a", 0o644, "a")))
	b := Image(t, v1.Config{}, base, Layer(t, File("b", 0o644, strings.Repeat("b", 100000))))
	refA, refB := reg.Push(t, "gc/a:1", a), reg.Push(t, "gc/b:1", b)
	c := newCache(t)
	dstA, dstB := mkdst(t, c), mkdst(t, c)
	imgA, err := c.Unpack(t.Context(), refA, dstA, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	imgB, err := c.Unpack(t.Context(), refB, dstB, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cacheState(t, c)); n != 3 {
		t.Fatalf("cache holds %d entries, want 3 layers: %v", n, cacheState(t, c))
	}
	freed, err := c.GC(t.Context(), imgA.Layers)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GC freed %d bytes", freed)
	left, _ := c.Layers()
	if len(left) != 2 || left[0] == imgB.Layers[1] || left[1] == imgB.Layers[1] {
		t.Errorf("after GC the cache holds %v, want imgA's %v", left, imgA.Layers)
	}
	if readFile(t, filepath.Join(dstB, "b")) != strings.Repeat("b", 100000) {
		t.Error("a tree unpacked before GC lost its file")
	}
	if _, err := c.GC(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if left, _ := c.Layers(); len(left) != 0 {
		t.Errorf("GC keeping nothing left %v", left)
	}
	if _, err := c.Unpack(t.Context(), refB, mkdst(t, c), oci.Options{}); err != nil {
		t.Errorf("Unpack after GC: %v", err)
	}
}
