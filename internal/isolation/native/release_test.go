package native_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// backendAt opens a native backend on a given state directory and
// instance, as a daemon (or its restart) does.
func backendAt(t *testing.T, stateDir, instance string) *native.Backend {
	t.Helper()
	testutil.RequireRoot(t)
	b, err := native.New(t.Context(), native.Options{StateDir: stateDir, Instance: instance, Executable: testutil.FenceBinary(t),
		Network: isolationtest.Network(nil)})
	if err != nil {
		t.Fatalf("native.New: %v", err)
	}
	return b
}

// waitPending waits until n releases are pending.
func waitPending(t *testing.T, b *native.Backend, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for b.PendingReleases() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d releases pending, want %d", b.PendingReleases(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKillReleasesInBackgroundBounded holds every background release and
// floods the backend with kills: each Kill returns once its sandbox can
// run nothing more while its resources are still held, no more kills
// return than the budget of pending releases allows (the others wait with
// their sandboxes already dead), and a Create meanwhile waits and fails
// clearly at its deadline. Once the releases go on, everything drains.
func TestKillReleasesInBackgroundBounded(t *testing.T) {
	state := filepath.Join(testutil.StateDir(t), "state")
	b := backendAt(t, state, "testreleasebounded")
	t.Cleanup(func() {
		b.Cleanup(context.Background())
		b.Close()
	})
	const budget, n = 2, 5
	release := b.HoldReleases(budget)
	defer release()
	var sbs []isolation.Sandbox
	for range n {
		sbs = append(sbs, create(t, b, isolation.Spec{}))
	}

	// The first kill returns while its release is held.
	if err := sbs[0].Kill(t.Context()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitDone(t, sbs[0])
	if b.PendingReleases() != 1 {
		t.Errorf("%d releases pending after one Kill, want 1", b.PendingReleases())
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", "testreleasebounded", sbs[0].ID())); err != nil {
		t.Errorf("the killed sandbox's state is already gone (%v): its release did not wait", err)
	}
	if c, err := sbs[0].DialAgent(t.Context()); err == nil {
		c.Close()
		t.Error("the agent of a killed sandbox answers")
	}

	// The flood: the others, at once.
	var returned atomic.Int32
	done := make(chan error, n-1)
	for _, s := range sbs[1:] {
		go func() {
			err := s.Kill(context.Background())
			returned.Add(1)
			done <- err
		}()
	}
	for _, s := range sbs[1:] {
		waitDone(t, s) // dead, whether or not its Kill has returned
	}
	waitPending(t, b, budget)
	time.Sleep(300 * time.Millisecond) // room for a kill that would overrun the budget
	if got := int(returned.Load()); got != budget-1 {
		t.Errorf("%d kills returned with %d releases held, want %d", got, budget, budget-1)
	}
	if p := b.PendingReleases(); p > budget {
		t.Errorf("%d releases pending, over the budget of %d", p, budget)
	}

	// A create waits for the teardown, and says so at its deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	_, err := b.Create(ctx, isolation.Spec{ID: "waiter", RootFS: testutil.RootFS(t, "minimal")})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Create with the teardown behind = %v, want it to wait until its deadline", err)
	} else {
		t.Logf("Create with the teardown behind: %v", err)
	}

	release()
	for range n - 1 {
		if err := <-done; err != nil {
			t.Errorf("Kill: %v", err)
		}
	}
	waitPending(t, b, 0)
	ids, err := b.Cleanup(t.Context())
	if err != nil || len(ids) != 0 {
		t.Errorf("Cleanup after the releases = %v, %v; want nothing left", ids, err)
	}
	create(t, b, isolation.Spec{})
}

// TestCrashWithReleasePending kills a sandbox whose release never runs
// (the daemon "crashes" before it) and checks that the next start's
// Cleanup removes what it held.
func TestCrashWithReleasePending(t *testing.T) {
	state := filepath.Join(testutil.StateDir(t), "state")
	b1 := backendAt(t, state, "testcrashpending")
	release := b1.HoldReleases(4)
	defer func() {
		release()
		b1.Close()
	}()
	s := create(t, b1, isolation.Spec{})
	if err := s.Kill(t.Context()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waitDone(t, s)
	b2 := backendAt(t, state, "testcrashpending")
	defer b2.Close()
	ids, err := b2.Cleanup(t.Context())
	if err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if !slices.Contains(ids, s.ID()) {
		t.Errorf("Cleanup = %v, want it to find the killed sandbox %s", ids, s.ID())
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", "testcrashpending", s.ID())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox's state survived Cleanup: %v", err)
	}
	if ids, err := b2.Cleanup(t.Context()); err != nil || slices.Contains(ids, s.ID()) {
		t.Errorf("second Cleanup = %v, %v", ids, err)
	}
}

func waitDone(t *testing.T, s isolation.Sandbox) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("sandbox %s still running", s.ID())
	}
}

// TestKillStopsEveryProcessAtOnce runs writers in a sandbox (one looping in
// a shell, one forking a new process for every write) into a host
// directory, kills the sandbox and checks that nothing is written once Kill
// has returned, though the processes' exits and the sandbox's teardown are
// left to the background.
func TestKillStopsEveryProcessAtOnce(t *testing.T) {
	b := newBackend(t)
	release := b.HoldReleases(8)
	defer release()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chown(dir, 1000, 1000)
	sb := create(t, b, isolation.Spec{Binds: []isolation.Bind{{HostPath: dir, Path: "/w"}}})
	script := `(while :; do echo a >> /w/a; done) </dev/null >/dev/null 2>&1 &
(while :; do sh -c 'echo b >> /w/b'; done) </dev/null >/dev/null 2>&1 &
echo started`
	if r := run(t, sb, "user", "/bin/sh", "-c", script); !strings.Contains(r.stdout, "started") {
		t.Fatalf("starting the writers: %+v", r)
	}
	size := func(name string) int64 {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return -1
		}
		return st.Size()
	}
	deadline := time.Now().Add(30 * time.Second)
	for size("a") <= 0 || size("b") <= 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the writers wrote nothing in 30 s (a: %d, b: %d bytes)", size("a"), size("b"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	a, bs := size("a"), size("b")
	time.Sleep(500 * time.Millisecond)
	if a2, b2 := size("a"), size("b"); a2 != a || b2 != bs {
		t.Errorf("written after Kill returned: a %d → %d bytes, b %d → %d bytes", a, a2, bs, b2)
	}
	waitDone(t, sb)
}

// A sandbox booted under the ID of a killed one whose release has not run
// yet (a rewind, a filesystem-only resume) does not wait for it: its host
// resources have names of their own. The release then removes the old
// sandbox's resources and not the new one's; a second live sandbox under
// the same ID is refused.
func TestRebootUnderIDDoesNotWaitForRelease(t *testing.T) { forStores(t, testRebootUnderID) }

func testRebootUnderID(t *testing.T, opts native.Options) {
	b := newBackendWith(t, opts)
	release := b.HoldReleases(8)
	t.Cleanup(release)
	old := create(t, b, isolation.Spec{})
	sh(t, old, `echo old > /mark`)
	if _, err := b.Create(t.Context(), isolation.Spec{ID: old.ID(), RootFS: testutil.RootFS(t, "minimal")}); err == nil {
		t.Fatal("a second live sandbox under the same ID was created")
	}
	if err := old.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	nb, err := b.Create(ctx, isolation.Spec{ID: old.ID(), RootFS: testutil.RootFS(t, "minimal")})
	if err != nil {
		t.Fatalf("create under the ID of a sandbox whose release is held: %v", err)
	}
	t.Cleanup(func() { nb.Kill(context.Background()) })
	t.Logf("booted under the ID of a sandbox being released in %v", time.Since(start))
	if b.PendingReleases() != 1 {
		t.Errorf("%d releases pending, want the old sandbox's", b.PendingReleases())
	}
	if got := sh(t, nb, `cat /mark 2>/dev/null; echo new > /mark2; cat /mark2`); got != "new\n" {
		t.Errorf("the new sandbox reads %q", got)
	}
	release()
	waitPending(t, b, 0)
	if got := sh(t, nb, `cat /mark2`); got != "new\n" {
		t.Errorf("after the old sandbox's release the new one reads %q", got)
	}
	if ids, err := b.Cleanup(t.Context()); err != nil || len(ids) != 0 {
		t.Errorf("Cleanup with the new sandbox live = %v, %v; want nothing removed", ids, err)
	}
	if got := sh(t, nb, `cat /mark2`); got != "new\n" {
		t.Errorf("after Cleanup the new sandbox reads %q", got)
	}
}
