package volume

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/testutil"
)

func TestToken(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Unix(1000, 0)
	s := &Service{st: st, key: []byte("0123456789abcdef0123456789abcdef"), now: func() time.Time { return now }}
	v := store.Volume{ID: newUUID(), Team: "team-a", Name: "v", SizeBytes: 8 << 20, CreatedAt: now}
	if err := st.InsertVolume(t.Context(), &v); err != nil {
		t.Fatal(err)
	}
	tok := s.token(v)
	if tok == s.token(v) {
		t.Error("two tokens of one volume are equal")
	}
	if got, err := s.Authorize(t.Context(), tok, v.ID); err != nil || got.ID != v.ID {
		t.Fatalf("Authorize = %+v, %v", got, err)
	}
	other := newUUID()
	body, mac, _ := strings.Cut(strings.TrimPrefix(tok, tokenPrefix), ".")
	for name, bad := range map[string]struct{ tok, id string }{
		"another volume": {tok, other},
		"no prefix":      {strings.TrimPrefix(tok, tokenPrefix), v.ID},
		"forged mac":     {tokenPrefix + body + "." + strings.Repeat("A", len(mac)), v.ID},
		"other key":      {(&Service{key: []byte("another key"), now: s.now}).token(v), v.ID},
		"empty":          {"", v.ID},
	} {
		if _, err := s.Authorize(t.Context(), bad.tok, bad.id); !errors.Is(err, api.ErrUnauthenticated) {
			t.Errorf("%s: %v, want unauthenticated", name, err)
		}
	}
	now = now.Add(tokenLifetime)
	if _, err := s.Authorize(t.Context(), tok, v.ID); !errors.Is(err, api.ErrUnauthenticated) {
		t.Errorf("an expired token: %v", err)
	}
	now = now.Add(-time.Hour)
	if err := st.DeleteVolume(t.Context(), v.Team, v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authorize(t.Context(), tok, v.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a deleted volume's token: %v, want not found", err)
	}
}

// openContent opens a plain directory as a volume's root.
func openContent(t *testing.T) (*Content, string) {
	t.Helper()
	testutil.RequireRoot(t) // files are given to OwnerID
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &Content{root: fd}
	t.Cleanup(func() { c.Close() })
	return c, dir
}

func TestContentNeverFollowsSymlinks(t *testing.T) {
	c, dir := openContent(t)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"link": secret, "dirlink": outside, "rel": "../" + filepath.Base(outside)} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/link", "/dirlink/secret", "rel/secret"} {
		if f, _, err := c.Read(p); err == nil {
			f.Close()
			t.Errorf("Read(%s) followed a symlink", p)
		}
		if _, err := c.Write(p, strings.NewReader("x"), FileOptions{Force: true}); err == nil {
			t.Errorf("Write(%s) followed a symlink", p)
		}
	}
	if _, err := c.List(t.Context(), "/dirlink", 1); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("List(/dirlink) = %v", err)
	}
	if _, err := c.MakeDir("/dirlink/new", FileOptions{Force: true}); err == nil {
		t.Error("MakeDir through a symlink")
	}
	mode := uint32(0o777)
	if _, err := c.SetMetadata("/link", api.VolumeMetadata{Mode: &mode}); err == nil {
		t.Error("SetMetadata(/link) changed a mode through a symlink")
	}
	uid := uint32(4242)
	if _, err := c.SetMetadata("/link", api.VolumeMetadata{UID: &uid}); err != nil {
		t.Errorf("SetMetadata(/link uid) = %v", err)
	}
	if err := c.Remove(t.Context(), "/dirlink"); err != nil {
		t.Errorf("Remove(/dirlink) = %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(secret, &st); err != nil || st.Mode&0o777 != 0o600 || st.Uid != 0 {
		t.Errorf("the target outside: %+v, %v", st, err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host secret" {
		t.Errorf("the target outside was written: %q", b)
	}
	if e, err := c.Stat("/link"); err != nil || e.Type != "symlink" || e.Target != secret {
		t.Errorf("Stat(/link) = %+v, %v", e, err)
	}
}

func TestContentFiles(t *testing.T) {
	c, dir := openContent(t)
	uid, mode := uint32(1234), uint32(0o640)
	e, err := c.Write("/a.txt", strings.NewReader("hello"), FileOptions{UID: &uid, GID: &uid, Mode: &mode})
	if err != nil || e.Type != "file" || e.Size != 5 || e.UID != 1234 || e.GID != 1234 || e.Mode != 0o640 || e.Path != "/a.txt" {
		t.Fatalf("Write = %+v, %v", e, err)
	}
	if _, err := c.Write("/a.txt", strings.NewReader("again"), FileOptions{}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("Write over an existing file without force: %v", err)
	}
	if e, err := c.Write("/a.txt", strings.NewReader("hi"), FileOptions{Force: true}); err != nil || e.Size != 2 || e.UID != OwnerID {
		t.Errorf("Write with force = %+v, %v", e, err)
	}
	if _, err := c.MakeDir("/d/e", FileOptions{}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("MakeDir without its parent: %v", err)
	}
	if e, err := c.MakeDir("/d/e", FileOptions{Force: true}); err != nil || e.Type != "directory" || e.UID != OwnerID || e.Mode != 0o755 {
		t.Errorf("MakeDir with force = %+v, %v", e, err)
	}
	if _, err := c.MakeDir("/d/e", FileOptions{}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("MakeDir of an existing dir: %v", err)
	}
	if _, err := c.Write("/d/e/f/g.txt", strings.NewReader("deep"), FileOptions{Force: true}); err != nil {
		t.Errorf("Write with force makes parents: %v", err)
	}
	list, err := c.List(t.Context(), "/", 1)
	if err != nil || len(list) != 2 {
		t.Errorf("List(/, 1) = %+v, %v", list, err)
	}
	if list, err := c.List(t.Context(), "/", 4); err != nil || len(list) != 5 {
		t.Errorf("List(/, 4) = %d entries, %v; want 5", len(list), err)
	}
	f, size, err := c.Read("/d/e/f/g.txt")
	if err != nil || size != 4 {
		t.Fatalf("Read = %d, %v", size, err)
	}
	f.Close()
	if err := c.Remove(t.Context(), "/d"); err != nil {
		t.Errorf("Remove(/d) = %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Errorf("/d after Remove: %v", err)
	}
	if err := c.Remove(t.Context(), "/"); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Remove(/) = %v", err)
	}
	if err := c.Remove(t.Context(), "/missing"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Remove(/missing) = %v", err)
	}
	for _, p := range []string{"", "/../x", "a/../../b", "a\x00b"} {
		if _, err := c.Stat(p); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Stat(%q) = %v, want invalid", p, err)
		}
	}
}
