package secrets

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
)

type env struct {
	s       *Store
	db      *store.Store
	dir     string
	dbPath  string
	keyPath string
}

func newEnv(t *testing.T, opts ...Options) *env {
	t.Helper()
	dir := t.TempDir()
	e := &env{dir: dir, dbPath: filepath.Join(dir, "fence.db"), keyPath: filepath.Join(dir, "secrets.key")}
	db, err := store.Open(t.Context(), e.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e.db = db
	o := Options{}
	if len(opts) > 0 {
		o = opts[0]
	}
	o.DB, o.KeyPath = db, e.keyPath
	if e.s, err = Open(o); err != nil {
		t.Fatal(err)
	}
	return e
}

// raw opens a second connection to the database, as an attacker with the
// file would.
func (e *env) raw(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+e.dbPath+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestIDFormat(t *testing.T) {
	// typeid's specification vector.
	u := [16]byte{0x01, 0x89, 0x0a, 0x5d, 0xac, 0x96, 0x77, 0x4b, 0xbc, 0xce, 0xb3, 0x02, 0x09, 0x9a, 0x80, 0x57}
	if got := encodeSuffix(u); got != "01h455vb4pex5vsknk084sn02q" {
		t.Errorf("encodeSuffix = %s, want 01h455vb4pex5vsknk084sn02q", got)
	}
	if back, ok := decodeSuffix("01h455vb4pex5vsknk084sn02q"); !ok || back != u {
		t.Errorf("decodeSuffix = %x %v, want %x", back, ok, u)
	}
	top := [16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if got := encodeSuffix(top); got != "7zzzzzzzzzzzzzzzzzzzzzzzzz" {
		t.Errorf("encodeSuffix(max) = %s", got)
	}
	for _, bad := range []string{"", "8zzzzzzzzzzzzzzzzzzzzzzzzz", "01h455vb4pex5vsknk084sn02", "01h455vb4pex5vsknk084sn02qq",
		"01h455vb4pex5vsknk084sn02u", "01H455VB4PEX5VSKNK084SN02Q"} {
		if _, ok := decodeSuffix(bad); ok {
			t.Errorf("decodeSuffix(%q) accepted", bad)
		}
	}
	e := newEnv(t)
	s, err := e.s.Create(t.Context(), "k", "v", nil)
	if err != nil {
		t.Fatal(err)
	}
	suffix, ok := strings.CutPrefix(s.ID, "sec_")
	id, valid := decodeSuffix(suffix)
	if !ok || len(suffix) != 26 || !valid {
		t.Fatalf("ID %q is not sec_ and a typeid suffix", s.ID)
	}
	if id[6]>>4 != 7 || id[8]>>6 != 2 {
		t.Errorf("ID %q is not a UUIDv7 (%x)", s.ID, id)
	}
	ms := int64(id[0])<<40 | int64(id[1])<<32 | int64(id[2])<<24 | int64(id[3])<<16 | int64(id[4])<<8 | int64(id[5])
	if ms != s.CreatedAt.UnixMilli() {
		t.Errorf("ID time %d, created %d", ms, s.CreatedAt.UnixMilli())
	}
}

// The value never reaches the database files in clear: not the current
// one, not an older version.
func TestValueNeverStoredInClear(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	v1 := "first-VALUE-4f9c2a7e61d3b805"
	v2 := "second-VALUE-a81e55c0d9b2f734"
	if _, err := e.s.Create(ctx, "api-key", v1, map[string]string{"team": "x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Update(ctx, "api-key", v2, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := e.s.Value(ctx, "api-key"); err != nil || got != v2 {
		t.Fatalf("Value = %q, %v; want the second value", got, err)
	}
	files, _ := filepath.Glob(e.dbPath + "*")
	if len(files) == 0 {
		t.Fatal("no database files")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{v1, v2} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds a secret value in clear", filepath.Base(f))
			}
		}
	}
	// And the check can fail: the name, stored in clear, is found.
	b, _ := os.ReadFile(e.dbPath + "-wal")
	b2, _ := os.ReadFile(e.dbPath)
	if !bytes.Contains(append(b, b2...), []byte("api-key")) {
		t.Error("the secret's name is not in the database files either: the search looks in the wrong place")
	}
}

// A sealed value copied onto another secret, or an older version's sealed
// value put back, does not open.
func TestSwappedCiphertextsFail(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	a, err := e.s.Create(ctx, "a", "value-of-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Create(ctx, "b", "value-of-b", nil); err != nil {
		t.Fatal(err)
	}
	raw := e.raw(t)
	if _, err := raw.Exec(`UPDATE secrets SET sealed = (SELECT sealed FROM secrets WHERE name = 'b') WHERE name = 'a'`); err != nil {
		t.Fatal(err)
	}
	if v, err := e.s.Value(ctx, "a"); err == nil || !errors.Is(err, ErrBackend) || strings.Contains(err.Error(), "value-of") {
		t.Errorf("Value(a) with b's sealed value = %q, %v; want ErrBackend without the value", v, err)
	}
	// By ID too.
	if _, err := e.s.Value(ctx, a.ID); !errors.Is(err, ErrBackend) {
		t.Errorf("Value(a's ID) with b's sealed value = %v, want ErrBackend", err)
	}
	if v, err := e.s.Value(ctx, "b"); err != nil || v != "value-of-b" {
		t.Errorf("Value(b) = %q, %v", v, err)
	}

	// Rollback to an older version's sealed value.
	if _, err := e.s.Create(ctx, "c", "old", nil); err != nil {
		t.Fatal(err)
	}
	var old []byte
	if err := raw.QueryRow(`SELECT sealed FROM secrets WHERE name = 'c'`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Update(ctx, "c", "new", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`UPDATE secrets SET sealed = ? WHERE name = 'c'`, old); err != nil {
		t.Fatal(err)
	}
	if v, err := e.s.Value(ctx, "c"); !errors.Is(err, ErrBackend) {
		t.Errorf("Value(c) with version 1's sealed value at version 2 = %q, %v; want ErrBackend", v, err)
	}
	// Putting version 1 back in full (version number too) opens: the
	// sealing binds ID and version, nothing else.
	if _, err := raw.Exec(`UPDATE secrets SET version = 1 WHERE name = 'c'`); err != nil {
		t.Fatal(err)
	}
	if v, err := e.s.Value(ctx, "c"); err != nil || v != "old" {
		t.Errorf("Value(c) restored to version 1 = %q, %v", v, err)
	}
}

func TestKeyFile(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if _, err := os.Lstat(e.keyPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("key file exists before any secret: %v", err)
	}
	if _, err := e.s.Create(ctx, "k", "v", nil); err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(e.keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode() != 0o600 || st.Size() != keyLen {
		t.Errorf("key file mode %v size %d, want -rw------- and %d bytes", st.Mode(), st.Size(), keyLen)
	}
	if left, _ := filepath.Glob(e.keyPath + ".tmp-*"); len(left) > 0 {
		t.Errorf("temporary key files left: %v", left)
	}
	key, _ := os.ReadFile(e.keyPath)

	// A second store on the same files opens the same values.
	s2, err := Open(Options{DB: e.db, KeyPath: e.keyPath})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s2.Value(ctx, "k"); err != nil || v != "v" {
		t.Errorf("reopened Value = %q, %v", v, err)
	}

	for _, mode := range []os.FileMode{0o640, 0o604, 0o610, 0o601, 0o644} {
		os.Chmod(e.keyPath, mode)
		if _, err := Open(Options{DB: e.db, KeyPath: e.keyPath}); err == nil || !strings.Contains(err.Error(), "mode") {
			t.Errorf("Open with key mode %04o = %v, want refused", mode, err)
		}
	}
	os.Chmod(e.keyPath, 0o600)

	// A symlink to a good key is refused, as is a short key.
	link := filepath.Join(e.dir, "link.key")
	os.Symlink(e.keyPath, link)
	if _, err := Open(Options{DB: e.db, KeyPath: link}); err == nil {
		t.Error("Open with a symlinked key file succeeded")
	}
	short := filepath.Join(e.dir, "short.key")
	os.WriteFile(short, key[:16], 0o600)
	if _, err := Open(Options{DB: e.db, KeyPath: short}); err == nil {
		t.Error("Open with a 16-byte key succeeded")
	}

	// A different key does not open the values, and says so.
	other := filepath.Join(e.dir, "other.key")
	os.WriteFile(other, bytes.Repeat([]byte{7}, keyLen), 0o600)
	s3, err := Open(Options{DB: e.db, KeyPath: other})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3.Value(ctx, "k"); !errors.Is(err, ErrBackend) {
		t.Errorf("Value with another key = %v, want ErrBackend", err)
	}

	// A lost key is not silently replaced while secrets exist.
	missing := filepath.Join(e.dir, "missing.key")
	s4, err := Open(Options{DB: e.db, KeyPath: missing})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s4.Create(ctx, "k2", "v", nil); !errors.Is(err, ErrBackend) {
		t.Errorf("Create with the key lost = %v, want ErrBackend", err)
	}
	if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a new key was made while secrets exist: %v", err)
	}
}

func TestVersionsAndMetadata(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	s, err := e.s.Create(ctx, "My-Key_1", "v1", map[string]string{"a": "1"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "my-key_1" || s.Version != 1 || s.Metadata["a"] != "1" || !s.CreatedAt.Equal(s.UpdatedAt) {
		t.Fatalf("Create = %+v", s)
	}
	u, err := e.s.Update(ctx, "my-key_1", "v2", nil)
	if err != nil {
		t.Fatal(err)
	}
	if u.Version != 2 || u.Metadata["a"] != "1" || u.ID != s.ID || !u.CreatedAt.Equal(s.CreatedAt) || u.UpdatedAt.Before(s.UpdatedAt) {
		t.Errorf("Update without metadata = %+v, want version 2 and metadata kept", u)
	}
	u, err = e.s.Update(ctx, s.ID, "v3", map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	if u.Version != 3 || len(u.Metadata) != 0 {
		t.Errorf("Update with {} = %+v, want version 3 and metadata emptied", u)
	}
	g, err := e.s.Get(ctx, "MY-KEY_1")
	if err != nil || g.Version != 3 || len(g.Metadata) != 0 || g.Metadata == nil {
		t.Errorf("Get = %+v, %v", g, err)
	}
	if v, _ := e.s.Value(ctx, "my-key_1"); v != "v3" {
		t.Errorf("Value = %q, want v3", v)
	}

	// Concurrent updates all land, each as its own version.
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			if _, err := e.s.Update(ctx, "my-key_1", fmt.Sprint("c", i), nil); err != nil {
				t.Errorf("concurrent Update = %v", err)
			}
		})
	}
	wg.Wait()
	if g, _ := e.s.Get(ctx, s.ID); g.Version != 13 {
		t.Errorf("after 10 concurrent updates version = %d, want 13", g.Version)
	}
	if v, err := e.s.Value(ctx, s.ID); err != nil || !strings.HasPrefix(v, "c") {
		t.Errorf("Value = %q, %v", v, err)
	}
}

func TestLimits(t *testing.T) {
	e := newEnv(t, Options{MaxSecrets: 3})
	ctx := t.Context()
	big := func(n int) string { return strings.Repeat("x", n) }
	many := func(n, size int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%03d", i)] = big(size)
		}
		return m
	}
	for _, tc := range []struct {
		name, value string
		md          map[string]string
		ok          bool
	}{
		{"ok", big(MaxValueBytes), many(MaxMetadataEntries, 10), true},
		{"v-big", big(MaxValueBytes + 1), nil, false},
		{"v-empty", "", nil, false},
		{"md-entries", "v", many(MaxMetadataEntries+1, 1), false},
		{"md-key", "v", map[string]string{big(MaxMetadataKeyBytes + 1): "v"}, false},
		{"md-key-ok", "v", map[string]string{big(MaxMetadataKeyBytes): big(MaxMetadataValueBytes)}, true},
		{"md-value", "v", map[string]string{"k": big(MaxMetadataValueBytes + 1)}, false},
		{"md-total", "v", many(9, 1000), false}, // 9 × 1004 > 8192
		{"md-empty-key", "v", map[string]string{"": "v"}, false},
		{"sec_name", "v", nil, false},
		{"SEC_name", "v", nil, false},
		{"a.b", "v", nil, false},
		{"a b", "v", nil, false},
		{"", "v", nil, false},
		{big(maxNameLen + 1), "v", nil, false},
		{"Ok", "v", nil, false}, // taken: names are case-insensitive
	} {
		_, err := e.s.Create(ctx, tc.name, tc.value, tc.md)
		if tc.ok && err != nil {
			t.Errorf("Create(%.20q) = %v, want ok", tc.name, err)
		}
		if !tc.ok && err == nil {
			t.Errorf("Create(%.20q) succeeded, want refused", tc.name)
		}
		if !tc.ok && tc.name != "Ok" && !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Create(%.20q) = %v, want ErrInvalidArgument", tc.name, err)
		}
		if tc.name == "Ok" && !errors.Is(err, api.ErrConflict) {
			t.Errorf("Create of a taken name = %v, want ErrConflict", err)
		}
	}
	// An update that breaks a limit changes nothing.
	if _, err := e.s.Update(ctx, "ok", big(MaxValueBytes+1), nil); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Update with a big value = %v", err)
	}
	if _, err := e.s.Update(ctx, "ok", "v", many(MaxMetadataEntries+1, 1)); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Update with too much metadata = %v", err)
	}
	if g, _ := e.s.Get(ctx, "ok"); g.Version != 1 || len(g.Metadata) != MaxMetadataEntries {
		t.Errorf("after refused updates: %+v", g)
	}
	// Exactly 128 bytes is a name; the store holds 2, so one more fits.
	if _, err := e.s.Create(ctx, big(maxNameLen), "v", nil); err != nil {
		t.Errorf("Create with a 128-byte name = %v", err)
	}
	if _, err := e.s.Create(ctx, "fourth", "v", nil); !errors.Is(err, api.ErrConflict) {
		t.Errorf("Create over MaxSecrets = %v, want ErrConflict", err)
	}
	if n, _ := e.db.CountSecrets(ctx); n != 3 {
		t.Errorf("%d secrets stored, want 3", n)
	}
}

func TestSelector(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	s, err := e.s.Create(ctx, "github-token", "ghp", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sel := range []string{"github-token", "GitHub-Token", "  github-token\t", s.ID, strings.ToUpper(s.ID), " " + s.ID + " "} {
		g, err := e.s.Get(ctx, sel)
		if err != nil || g.ID != s.ID {
			t.Errorf("Get(%q) = %+v, %v", sel, g, err)
		}
		if v, err := e.s.Value(ctx, sel); err != nil || v != "ghp" {
			t.Errorf("Value(%q) = %q, %v", sel, v, err)
		}
	}
	unknownID := "sec_" + encodeSuffix([16]byte{1, 2, 3})
	for sel, want := range map[string]error{
		"sec_":                           api.ErrInvalidArgument,
		"sec_github-token":               api.ErrInvalidArgument,
		"sec_zzzzzzzzzzzzzzzzzzzzzzzzzz": api.ErrInvalidArgument, // first digit over 7
		unknownID:                        api.ErrNotFound,
		"other":                          api.ErrNotFound,
		"a/b":                            api.ErrInvalidArgument,
		"":                               api.ErrInvalidArgument,
	} {
		if _, err := e.s.Get(ctx, sel); !errors.Is(err, want) {
			t.Errorf("Get(%q) = %v, want %v", sel, err, want)
		}
		if _, err := e.s.Update(ctx, sel, "v", nil); !errors.Is(err, want) {
			t.Errorf("Update(%q) = %v, want %v", sel, err, want)
		}
		if err := e.s.Delete(ctx, sel); !errors.Is(err, want) {
			t.Errorf("Delete(%q) = %v, want %v", sel, err, want)
		}
		if _, err := e.s.Value(ctx, sel); !errors.Is(err, want) {
			t.Errorf("Value(%q) = %v, want %v", sel, err, want)
		}
	}
	if err := e.s.Delete(ctx, "GITHUB-TOKEN"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Value(ctx, "github-token"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Value after Delete = %v, want ErrNotFound", err)
	}
	if err := e.s.Delete(ctx, s.ID); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("second Delete = %v, want ErrNotFound", err)
	}
	// The name is free again, under a new ID.
	s2, err := e.s.Create(ctx, "github-token", "ghp2", nil)
	if err != nil || s2.ID == s.ID || s2.Version != 1 {
		t.Errorf("re-Create = %+v, %v", s2, err)
	}
}

func TestUpdateWithoutKeyIsNotFound(t *testing.T) {
	e := newEnv(t)
	if _, err := e.s.Update(t.Context(), "nothing", "v", nil); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Update on an empty store = %v, want ErrNotFound", err)
	}
	if _, err := os.Lstat(e.keyPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Update made a key file: %v", err)
	}
}

func TestPaging(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	want := map[string]bool{}
	for i := range 5 {
		s, err := e.s.Create(ctx, fmt.Sprint("s", i), "v", nil)
		if err != nil {
			t.Fatal(err)
		}
		want[s.ID] = true
	}
	seen := map[string]bool{}
	var sizes []int
	tok := ""
	for {
		page, next, err := e.s.List(ctx, 2, tok)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page))
		for _, s := range page {
			if seen[s.ID] {
				t.Errorf("%s listed twice", s.ID)
			}
			seen[s.ID] = true
		}
		if next == "" {
			break
		}
		tok = next
	}
	if fmt.Sprint(sizes) != "[2 2 1]" || len(seen) != len(want) {
		t.Errorf("pages %v, %d seen, want [2 2 1] and 5", sizes, len(seen))
	}
	all, next, err := e.s.List(ctx, 100, "")
	if err != nil || next != "" || len(all) != 5 {
		t.Fatalf("List(100) = %d, %q, %v", len(all), next, err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].CreatedAt.After(all[i-1].CreatedAt) {
			t.Errorf("not newest first: %v after %v", all[i].CreatedAt, all[i-1].CreatedAt)
		}
	}
	for _, bad := range []string{"x", "!!", pageToken(store.SecretCursor{ID: "nope"})} {
		if _, _, err := e.s.List(ctx, 2, bad); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("List(token %q) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	for _, n := range []int{0, 101, -1} {
		if _, _, err := e.s.List(ctx, n, ""); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("List(limit %d) = %v", n, err)
		}
	}
}

// BenchmarkValue measures what the gateway pays per placeholder: a lookup
// by name and an AES-GCM open.
func BenchmarkValue(b *testing.B) {
	dir := b.TempDir()
	db, err := store.Open(b.Context(), filepath.Join(dir, "fence.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	s, err := Open(Options{DB: db, KeyPath: filepath.Join(dir, "secrets.key")})
	if err != nil {
		b.Fatal(err)
	}
	for i := range 1000 {
		if _, err := s.Create(b.Context(), fmt.Sprint("k", i), strings.Repeat("v", 64), nil); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if _, err := s.Value(b.Context(), "k500"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSealData(t *testing.T) {
	ctx := t.Context()
	s := newEnv(t).s
	sealed, err := s.Seal(ctx, "sandbox-resume:a", []byte("E=v"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sealed), "E=v") {
		t.Fatalf("sealed data holds the plaintext: %q", sealed)
	}
	if got, err := s.Unseal(ctx, "sandbox-resume:a", sealed); err != nil || string(got) != "E=v" {
		t.Fatalf("Unseal = %q, %v", got, err)
	}
	if _, err := s.Unseal(ctx, "sandbox-resume:b", sealed); err == nil {
		t.Errorf("sealed data opened for another purpose")
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := s.Unseal(ctx, "sandbox-resume:a", sealed); err == nil {
		t.Errorf("tampered sealed data opened")
	}
}
