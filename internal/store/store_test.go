package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store/pgtest"
)

// openTest opens a new store for t: the file alone, or the file and a
// new PostgreSQL database when t runs under TestPostgres.
func openTest(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	if onPostgres.Load() {
		dsns.Store(path, pgtest.Database(t))
	}
	s := reopen(t, path)
	t.Cleanup(func() { s.Close() })
	return s, path
}

// reopen opens the store openTest made at path again.
func reopen(t *testing.T, path string) *Store {
	t.Helper()
	o := Options{Path: path}
	if dsn, ok := dsns.Load(path); ok {
		o.DatabaseURL = dsn.(string)
	}
	s, err := OpenWith(t.Context(), o)
	if err != nil {
		t.Fatalf("OpenWith(%+v) = %v", o, err)
	}
	return s
}

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func rec(id string, age int, md map[string]string) *Sandbox {
	yes := true
	return &Sandbox{
		ID: id, Template: "base", State: StateRunning,
		CreatedAt: t0.Add(time.Duration(age) * time.Second), EndAt: t0.Add(time.Hour),
		Metadata: md, CPUs: 2, MemoryMB: 512, DiskMB: 1024, EnvdAccessToken: "tok-" + id,
		AllowInternetAccess: &yes, Network: &api.NetworkConfig{AllowOut: []string{"example.com"}}, Slot: age,
	}
}

func TestInsertGet(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	want := rec("a1", 1, map[string]string{"k": "v w"})
	if err := s.Insert(ctx, want); err != nil {
		t.Fatalf("Insert = %v", err)
	}
	got, err := s.Get(ctx, "a1")
	if err != nil {
		t.Fatalf("Get(a1) = %v", err)
	}
	if got.ID != want.ID || got.Template != want.Template || got.State != StateRunning ||
		!got.CreatedAt.Equal(want.CreatedAt) || !got.EndAt.Equal(want.EndAt) || got.Metadata["k"] != "v w" ||
		got.CPUs != 2 || got.MemoryMB != 512 || got.DiskMB != 1024 || got.EnvdAccessToken != "tok-a1" ||
		got.AllowInternetAccess == nil || !*got.AllowInternetAccess || got.Network == nil ||
		got.Network.AllowOut[0] != "example.com" || got.Slot != 1 {
		t.Errorf("Get(a1) = %+v, want %+v", got, want)
	}
	if err := s.Insert(ctx, want); !errors.Is(err, api.ErrConflict) {
		t.Errorf("Insert(duplicate) = %v, want ErrConflict", err)
	}
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(nope) = %v, want ErrNotFound", err)
	}
	// Nil optional fields round-trip as nil.
	bare := &Sandbox{ID: "b1", Template: "t", CreatedAt: t0, EndAt: t0}
	if err := s.Insert(ctx, bare); err != nil {
		t.Fatalf("Insert(bare) = %v", err)
	}
	got, err = s.Get(ctx, "b1")
	if err != nil {
		t.Fatalf("Get(b1) = %v", err)
	}
	if got.AllowInternetAccess != nil || got.Network != nil || len(got.Metadata) != 0 || got.State != StateRunning {
		t.Errorf("Get(b1) = %+v, want nil optionals, running", got)
	}
}

func ids(sbs []*Sandbox) string {
	var out string
	for _, s := range sbs {
		out += s.ID + " "
	}
	return out
}

func TestList(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	for i, md := range []map[string]string{
		{"a": "1"}, {"a": "1", "b": "2"}, {"a": "2"}, nil, {"a": "1", "b": "x y"},
	} {
		if err := s.Insert(ctx, rec(fmt.Sprintf("s%d", i), i, md)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetState(ctx, "s3", StateKilled); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		f    Filter
		want string
	}{
		{"all", Filter{}, "s4 s3 s2 s1 s0 "},
		{"running", Filter{State: StateRunning}, "s4 s2 s1 s0 "},
		{"killed", Filter{State: StateKilled}, "s3 "},
		{"metadata one", Filter{Metadata: map[string]string{"a": "1"}}, "s4 s1 s0 "},
		{"metadata two", Filter{Metadata: map[string]string{"a": "1", "b": "2"}}, "s1 "},
		{"metadata space", Filter{Metadata: map[string]string{"b": "x y"}}, "s4 "},
		{"metadata none", Filter{Metadata: map[string]string{"z": "1"}}, ""},
		{"limit", Filter{Limit: 2}, "s4 s3 "},
		{"before", Filter{Before: &Cursor{CreatedAt: t0.Add(3 * time.Second), ID: "s3"}, Limit: 2}, "s2 s1 "},
		{"template", Filter{Template: "other"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.List(ctx, tt.f)
			if err != nil {
				t.Fatalf("List(%+v) = %v", tt.f, err)
			}
			if ids(got) != tt.want {
				t.Errorf("List(%+v) = %q, want %q", tt.f, ids(got), tt.want)
			}
		})
	}
	// Same created_at: the ID breaks the tie, and the cursor pages through.
	for _, id := range []string{"t1", "t2", "t3"} {
		r := rec(id, 100, nil)
		if err := s.Insert(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	page, err := s.List(ctx, Filter{Before: &Cursor{CreatedAt: t0.Add(100 * time.Second), ID: "t3"}, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ids(page), "t2 t1 "; got != want {
		t.Errorf("List(tie cursor) = %q, want %q", got, want)
	}
}

func TestUpdateAndState(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	if err := s.Insert(ctx, rec("a", 0, nil)); err != nil {
		t.Fatal(err)
	}
	end := t0.Add(2 * time.Hour)
	if err := s.UpdateEndAt(ctx, "a", end); err != nil {
		t.Fatalf("UpdateEndAt = %v", err)
	}
	got, _ := s.Get(ctx, "a")
	if !got.EndAt.Equal(end) {
		t.Errorf("EndAt = %v, want %v", got.EndAt, end)
	}
	if err := s.SetState(ctx, "a", StateKilled); err != nil {
		t.Fatalf("SetState = %v", err)
	}
	got, _ = s.Get(ctx, "a")
	if got.State != StateKilled || got.EnvdAccessToken != "" {
		t.Errorf("after kill: state %q token %q, want killed and empty", got.State, got.EnvdAccessToken)
	}
	if err := s.UpdateEndAt(ctx, "a", end); !errors.Is(err, ErrNotFound) {
		t.Errorf("UpdateEndAt(killed) = %v, want ErrNotFound", err)
	}
	running, err := s.ListRunning(ctx)
	if err != nil || len(running) != 0 {
		t.Errorf("ListRunning = %v, %v; want none", ids(running), err)
	}
	if n, err := s.DeleteKilledBefore(ctx, t0.Add(time.Second)); err != nil || n != 1 {
		t.Errorf("DeleteKilledBefore = %d, %v; want 1", n, err)
	}
	if err := s.Delete(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Delete(gone) = %v, want ErrNotFound", err)
	}
	if err := s.SetState(ctx, "zz", StateKilled); !errors.Is(err, ErrNotFound) {
		t.Errorf("SetState(unknown) = %v, want ErrNotFound", err)
	}
}

func TestReopenKeepsData(t *testing.T) {
	s, path := openTest(t)
	if err := s.Insert(t.Context(), rec("keep", 0, nil)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(t.Context(), path)
	if err != nil {
		t.Fatalf("reopen = %v", err)
	}
	defer s2.Close()
	if _, err := s2.Get(t.Context(), "keep"); err != nil {
		t.Errorf("Get after reopen = %v", err)
	}
}

func TestConcurrentWrites(t *testing.T) {
	s, _ := openTest(t)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Go(func() {
			id := fmt.Sprintf("c%d", i)
			if err := s.Insert(t.Context(), rec(id, i, nil)); err != nil {
				errs <- err
				return
			}
			errs <- s.UpdateEndAt(t.Context(), id, t0)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent write: %v", err)
		}
	}
	all, _ := s.List(t.Context(), Filter{})
	if len(all) != 50 {
		t.Errorf("List = %d records, want 50", len(all))
	}
}

// TestFDsCloseOnExec checks invariant 6 for SQLite's own file descriptors
// (database, WAL and shm files), which modernc's libc opens itself.
func TestFDsCloseOnExec(t *testing.T) {
	s, path := openTest(t)
	if err := s.Insert(t.Context(), rec("x", 0, nil)); err != nil { // forces the WAL open
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	dir := filepath.Dir(path)
	found := 0
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(target, dir) {
			continue
		}
		found++
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue
		}
		var flags int64
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, _ = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			}
		}
		if flags&syscall.O_CLOEXEC == 0 {
			t.Errorf("fd %s (%s) flags %o lack O_CLOEXEC", e.Name(), target, flags)
		}
	}
	if found == 0 {
		t.Errorf("found no open fd under %s; the check checked nothing", dir)
	}
}

func TestListOrderAndStartedAfter(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	for i, id := range []string{"a", "b", "c", "d"} {
		if err := s.Insert(ctx, rec(id, i, nil)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		f    Filter
		want string
	}{
		{"ascending", Filter{Ascending: true}, "a b c d "},
		{"ascending page", Filter{Ascending: true, Before: &Cursor{CreatedAt: t0.Add(time.Second), ID: "b"}, Limit: 1}, "c "},
		{"descending page", Filter{Before: &Cursor{CreatedAt: t0.Add(2 * time.Second), ID: "c"}}, "b a "},
		{"started after", Filter{StartedAfter: t0.Add(2 * time.Second)}, "d c "},
		{"started after ascending", Filter{StartedAfter: t0.Add(time.Second), Ascending: true}, "b c d "},
	}
	for _, tt := range tests {
		got, err := s.List(ctx, tt.f)
		if err != nil || ids(got) != tt.want {
			t.Errorf("%s: List(%+v) = %s, %v; want %s", tt.name, tt.f, ids(got), err, tt.want)
		}
	}
}

// TestFileModes: the database and its sidecars are the owner's alone even
// under a permissive umask, and an older database left world-readable is
// narrowed on Open.
func TestFileModes(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "new")
	path := filepath.Join(dir, "fence.db")
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Insert(t.Context(), rec("a", 1, nil)); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			st, err := os.Stat(p)
			if err != nil {
				t.Errorf("%s: %v", when, err)
				continue
			}
			if m := st.Mode().Perm(); m != 0o600 {
				t.Errorf("%s: %s has mode %o, want 600", when, filepath.Base(p), m)
			}
		}
	}
	check("new database")
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("database directory created with %v (%v), want 700", st.Mode(), err)
	}
	s.Close()

	// An older install: the database written world-readable.
	old2 := filepath.Join(t.TempDir(), "fence.db")
	s, err = Open(t.Context(), old2)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Insert(t.Context(), rec("b", 1, nil)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, sfx := range []string{"", "-wal", "-shm"} {
		os.WriteFile(old2+sfx, nil, 0o644) // creates the sidecars Close removed
		if err := os.Chmod(old2+sfx, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path = old2
	if err := os.Truncate(old2, 0); err != nil {
		t.Fatal(err)
	}
	s, err = Open(t.Context(), old2)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check("older database")
}

func TestPausedTransitions(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	for i, id := range []string{"p1", "p2", "p3"} {
		if err := s.Insert(ctx, rec(id, i, nil)); err != nil {
			t.Fatal(err)
		}
	}
	pausedAt := t0.Add(time.Minute)
	if err := s.Transition(ctx, "p2", StateRunning, StatePaused, t0.Add(time.Second), pausedAt); err != nil {
		t.Fatalf("Transition(running→paused) = %v", err)
	}
	if err := s.Transition(ctx, "p2", StateRunning, StatePaused, t0, pausedAt); !errors.Is(err, ErrNotFound) {
		t.Errorf("Transition of a record not in the from state = %v, want ErrNotFound", err)
	}
	if err := s.SetState(ctx, "p3", StateKilled); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "p2")
	if err != nil || got.State != StatePaused || !got.EndAt.Equal(pausedAt) || got.EnvdAccessToken != "tok-p2" {
		t.Errorf("Get(p2) = %+v, %v; want paused at %v with its token", got, err, pausedAt)
	}
	for _, tc := range []struct {
		states []State
		want   string
	}{
		{[]State{StatePaused}, "p2 "},
		{[]State{StateRunning}, "p1 "},
		{[]State{StateRunning, StatePaused}, "p2 p1 "},
		{nil, "p3 p2 p1 "},
	} {
		l, err := s.List(ctx, Filter{States: tc.states})
		if err != nil || ids(l) != tc.want {
			t.Errorf("List(States %v) = %s, %v; want %s", tc.states, ids(l), err, tc.want)
		}
	}
	// Resuming starts a new run: its start and deadline move.
	resumed := t0.Add(2 * time.Minute)
	if err := s.Transition(ctx, "p2", StatePaused, StateRunning, resumed, resumed.Add(time.Hour)); err != nil {
		t.Fatalf("Transition(paused→running) = %v", err)
	}
	got, _ = s.Get(ctx, "p2")
	if got.State != StateRunning || !got.CreatedAt.Equal(resumed) || !got.EndAt.Equal(resumed.Add(time.Hour)) {
		t.Errorf("Get(p2) after resume = %+v", got)
	}
}

// TestMigrationKeepsRecords opens a database at the schema before paused
// sandboxes and checks that its records survive the table's rebuild.
func TestMigrationKeepsRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.db")
	saved := migrations
	migrations = saved[:2]
	s, err := Open(t.Context(), path)
	if err != nil {
		migrations = saved
		t.Fatal(err)
	}
	// The insert of that schema (its columns).
	r := rec("old1", 1, map[string]string{"k": "v"})
	_, err = s.db.ExecContext(t.Context(), `INSERT INTO sandboxes (`+columns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		r.ID, r.Template, string(StateRunning), r.CreatedAt.UnixNano(), r.EndAt.UnixNano(), `{"k":"v"}`,
		r.CPUs, r.MemoryMB, r.DiskMB, r.EnvdAccessToken, nil, nil, r.Slot)
	s.Close()
	migrations = saved
	if err != nil {
		t.Fatal(err)
	}
	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open after the upgrade = %v", err)
	}
	defer s.Close()
	got, err := s.Get(t.Context(), "old1")
	if err != nil || got.Metadata["k"] != "v" || got.EnvdAccessToken != "tok-old1" || got.Slot != 1 {
		t.Fatalf("Get(old1) after the upgrade = %+v, %v", got, err)
	}
	if err := s.Transition(t.Context(), "old1", StateRunning, StatePaused, got.CreatedAt, t0); err != nil {
		t.Errorf("pausing an upgraded record = %v", err)
	}
}
