// Package isolationtest is the conformance suite every isolation.Backend
// must pass. A backend's own test calls Run with a factory:
//
//	func TestConformance(t *testing.T) {
//		isolationtest.Run(t, func(t *testing.T) isolation.Backend { return newBackend(t, stateDir) }, rootfs)
//	}
//
// Backends returned by one Run's factory must share their host state (the
// same state directory, for a real backend): the crash test makes one
// backend, drops it without killing its sandbox, and expects a second
// backend's Cleanup to find and remove the leftover, as a restarted daemon
// would. Subtests run one after another and each kills what it creates.
package isolationtest

import (
	"context"
	"crypto/rand"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netfence"
)

// waitLimit bounds how long the suite waits for something that must happen
// (Done closing). It is a hang guard, not a performance assertion.
const waitLimit = 30 * time.Second

// Run runs the conformance suite. rootfs must be a valid template root.
func Run(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string)
	}{
		{"CreateHealth", testCreateHealth},
		{"KillIdempotent", testKillIdempotent},
		{"CleanupAfterCrash", testCleanupAfterCrash},
		{"Stats", testStats},
		{"BadRootFS", testBadRootFS},
		{"ConcurrentCreates", testConcurrentCreates},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newBackend, rootfs) })
	}
}

// Network returns a deny-all fence for a test backend's sandboxes (its
// Options.Network, for the Specs that name none): a real netfence stack
// per attached namespace, its flows given to rec (nil: logged at debug
// level, discarded).
func Network(rec egress.Recorder) *netfence.Net {
	f := netfence.Fence{Recorder: rec}.WithDefaults()
	return f.New(nil)
}

// NewID returns a fresh sandbox ID for tests: "t" and 15 chars of [a-z0-9].
func NewID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 16)
	rand.Read(b)
	b[0] = 't'
	for i := 1; i < len(b); i++ {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func create(t *testing.T, b isolation.Backend, rootfs string) isolation.Sandbox {
	t.Helper()
	spec := isolation.Spec{ID: NewID(), RootFS: rootfs}
	s, err := b.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("Create(%s) = %v", spec.ID, err)
	}
	if s.ID() != spec.ID {
		t.Errorf("Create(%s).ID() = %q", spec.ID, s.ID())
	}
	t.Cleanup(func() { s.Kill(context.WithoutCancel(t.Context())) })
	return s
}

// health does GET /health on the sandbox's agent and returns the status.
func health(ctx context.Context, s isolation.Sandbox) (int, error) {
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return s.DialAgent(ctx) },
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
	if err != nil {
		return 0, err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func waitDone(t *testing.T, s isolation.Sandbox, what string) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(waitLimit):
		t.Fatalf("Done() of %s not closed %s", s.ID(), what)
	}
}

func testCreateHealth(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	s := create(t, b, rootfs)
	code, err := health(t.Context(), s)
	if err != nil || code != http.StatusNoContent {
		t.Errorf("GET /health = %d, %v; want 204", code, err)
	}
	select {
	case <-s.Done():
		t.Errorf("Done() closed on a running sandbox")
	default:
	}
}

func testKillIdempotent(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	s := create(t, b, rootfs)
	if err := s.Kill(t.Context()); err != nil {
		t.Fatalf("Kill() = %v", err)
	}
	waitDone(t, s, "after Kill")
	if err := s.Kill(t.Context()); err != nil {
		t.Errorf("second Kill() = %v, want nil", err)
	}
	if c, err := s.DialAgent(t.Context()); err == nil {
		c.Close()
		t.Errorf("DialAgent() after Kill succeeded, want error")
	}
	ids, err := b.Cleanup(t.Context())
	if err != nil {
		t.Errorf("Cleanup() = %v", err)
	}
	if slices.Contains(ids, s.ID()) {
		t.Errorf("Cleanup() = %v, found the killed sandbox %s", ids, s.ID())
	}
}

func testCleanupAfterCrash(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b1 := newBackend(t)
	s := create(t, b1, rootfs)
	// The daemon "crashes": b1 and s are dropped without Kill.
	b2 := newBackend(t)
	ids, err := b2.Cleanup(t.Context())
	if err != nil {
		t.Fatalf("Cleanup() = %v", err)
	}
	if !slices.Contains(ids, s.ID()) {
		t.Errorf("Cleanup() = %v, want it to contain %s", ids, s.ID())
	}
	waitDone(t, s, "after Cleanup")
	if c, err := s.DialAgent(t.Context()); err == nil {
		c.Close()
		t.Errorf("DialAgent() after Cleanup succeeded, want error")
	}
	ids, err = b2.Cleanup(t.Context())
	if err != nil || slices.Contains(ids, s.ID()) {
		t.Errorf("second Cleanup() = %v, %v; want no %s", ids, err, s.ID())
	}
}

func testStats(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	s := create(t, b, rootfs)
	st, err := s.Stats(t.Context())
	if err != nil {
		t.Fatalf("Stats() = %v", err)
	}
	if st.MemoryBytes < 0 || st.CPUUsage < 0 || st.DiskBytes < 0 {
		t.Errorf("Stats() = %+v, want non-negative readings", st)
	}
}

func testBadRootFS(t *testing.T, newBackend func(t *testing.T) isolation.Backend, _ string) {
	b := newBackend(t)
	spec := isolation.Spec{ID: NewID(), RootFS: filepath.Join(t.TempDir(), "does-not-exist")}
	s, err := b.Create(t.Context(), spec)
	if err == nil {
		s.Kill(t.Context())
		t.Fatalf("Create(bad rootfs) succeeded, want error")
	}
	ids, err := b.Cleanup(t.Context())
	if err != nil {
		t.Errorf("Cleanup() = %v", err)
	}
	if slices.Contains(ids, spec.ID) {
		t.Errorf("Cleanup() = %v: the failed create left %s behind", ids, spec.ID)
	}
}

func testConcurrentCreates(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	const n = 10
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		sbs  []isolation.Sandbox
		errs []error
	)
	for range n {
		wg.Go(func() {
			s, err := b.Create(t.Context(), isolation.Spec{ID: NewID(), RootFS: rootfs})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			sbs = append(sbs, s)
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, s := range sbs {
			s.Kill(context.WithoutCancel(t.Context()))
		}
	})
	for _, err := range errs {
		t.Errorf("concurrent Create() = %v", err)
	}
	for _, s := range sbs {
		if code, err := health(t.Context(), s); err != nil || code != http.StatusNoContent {
			t.Errorf("GET /health on %s = %d, %v; want 204", s.ID(), code, err)
		}
	}
	for _, s := range sbs {
		if err := s.Kill(t.Context()); err != nil {
			t.Errorf("Kill(%s) = %v", s.ID(), err)
		}
	}
}
