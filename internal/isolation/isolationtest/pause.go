package isolationtest

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
	"github.com/fencesandbox/fence/internal/isolation"
)

// RunPause runs the conformance cases of isolation.Pauser. They run real
// processes through the agent's process API, so they need a backend with a
// real agent (not the fake). Sandboxes are created from a Spec with only
// RootFS set, so a pool in front of the backend (package warm) started
// with that RootFS and zero Limits serves them.
func RunPause(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string)
	}{
		{"PauseStopsAndResumeContinues", testPauseResume},
		{"KillPaused", testKillPaused},
		{"CleanupPausedAfterCrash", testCleanupPausedAfterCrash},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newBackend, rootfs) })
	}
}

// counterLoop counts in /tmp/c ten times a second, in the background.
const counterLoop = `(i=0; while :; do i=$((i+1)); echo $i > /tmp/c.n && mv -f /tmp/c.n /tmp/c; sleep 0.1; done) </dev/null >/dev/null 2>&1 &`

func createPausable(t *testing.T, b isolation.Backend, rootfs string) (isolation.Sandbox, isolation.Pauser) {
	t.Helper()
	s, err := b.Create(t.Context(), isolation.Spec{RootFS: rootfs})
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	t.Cleanup(func() { s.Kill(context.WithoutCancel(t.Context())) })
	p, ok := isolation.As[isolation.Pauser](s)
	if !ok {
		t.Fatalf("sandbox %T does not implement isolation.Pauser", s)
	}
	return s, p
}

// Exec runs argv in s as root through the agent's process API and returns
// its output and exit code.
func Exec(ctx context.Context, s isolation.Sandbox, argv ...string) (string, int32, error) {
	return ExecAs(ctx, s, "root", argv...)
}

// ExecAs is Exec as the sandbox's user named user.
func ExecAs(ctx context.Context, s isolation.Sandbox, user string, argv ...string) (string, int32, error) {
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return s.DialAgent(ctx) },
		DisableKeepAlives: true,
	}}
	c := processconnect.NewProcessClient(hc, "http://agent", connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(ctx, waitLimit)
	defer cancel()
	stdin := false
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: argv[0], Args: argv[1:]},
		Stdin:   &stdin,
	})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	stream, err := c.Start(ctx, req)
	if err != nil {
		return "", 0, err
	}
	defer stream.Close()
	var out bytes.Buffer
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return out.String(), end.GetExitCode(), nil
		}
	}
	return out.String(), 0, fmt.Errorf("stream ended without an exit: %v", stream.Err())
}

func mustExec(t *testing.T, s isolation.Sandbox, argv ...string) string {
	t.Helper()
	out, code, err := Exec(t.Context(), s, argv...)
	if err != nil || code != 0 {
		t.Fatalf("exec %q = %q, exit %d, %v", argv, out, code, err)
	}
	return out
}

func readCounter(t *testing.T, s isolation.Sandbox) int {
	t.Helper()
	out := mustExec(t, s, "sh", "-c", "cat /tmp/c 2>/dev/null || echo 0") // 0 until the loop's first write
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("/tmp/c = %q", out)
	}
	return n
}

// waitAdvance waits until the counter is above n and returns it.
func waitAdvance(t *testing.T, s isolation.Sandbox, n int) int {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		if c := readCounter(t, s); c > n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the counter stayed at %d for %v", n, waitLimit)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func testPauseResume(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	s, p := createPausable(t, b, rootfs)
	mustExec(t, s, "sh", "-c", "echo kept > /tmp/file && "+counterLoop)
	// Running: the counter advances.
	c0 := waitAdvance(t, s, 0)
	c1 := waitAdvance(t, s, c0)

	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	if err := p.Pause(t.Context()); err != nil {
		t.Errorf("second Pause() = %v, want nil", err)
	}
	// While paused, the agent refuses at once.
	ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
	c, err := s.DialAgent(ctx)
	cancel()
	if err == nil {
		c.Close()
		t.Errorf("DialAgent() while paused succeeded, want ErrPaused")
	} else if !errors.Is(err, isolation.ErrPaused) {
		t.Errorf("DialAgent() while paused = %v, want ErrPaused", err)
	}
	select {
	case <-s.Done():
		t.Fatalf("Done() closed on a paused sandbox")
	default:
	}
	// Three seconds paused would be ~30 counts running.
	const pausedFor = 3 * time.Second
	time.Sleep(pausedFor)
	if err := p.Resume(t.Context()); err != nil {
		t.Fatalf("Resume() = %v", err)
	}
	if err := p.Resume(t.Context()); err != nil {
		t.Errorf("second Resume() = %v, want nil", err)
	}
	c2 := readCounter(t, s)
	t.Logf("counter: %d before the pause, %d right after %v paused", c1, c2, pausedFor)
	// The counter may take a step or two around the pause and the read;
	// a loop that ran while paused would be ~30 ahead.
	if c2 < c1 || c2-c1 > 10 {
		t.Errorf("counter went from %d to %d over a %v pause: the loop was not stopped", c1, c2, pausedFor)
	}
	// It continues from where it was, in the same process.
	c3 := waitAdvance(t, s, c2)
	if c3 < c2 {
		t.Errorf("counter went back from %d to %d", c2, c3)
	}
	if got := mustExec(t, s, "cat", "/tmp/file"); got != "kept\n" {
		t.Errorf("/tmp/file after resume = %q, want kept", got)
	}
	if code, err := health(t.Context(), s); err != nil || code != http.StatusNoContent {
		t.Errorf("GET /health after resume = %d, %v; want 204", code, err)
	}
}

func testKillPaused(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	s, p := createPausable(t, b, rootfs)
	mustExec(t, s, "sh", "-c", counterLoop)
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	if err := s.Kill(t.Context()); err != nil {
		t.Fatalf("Kill() of a paused sandbox = %v", err)
	}
	waitDone(t, s, "after Kill of a paused sandbox")
	if err := p.Resume(t.Context()); err == nil {
		t.Errorf("Resume() after Kill succeeded, want error")
	}
	if err := p.Pause(t.Context()); err == nil {
		t.Errorf("Pause() after Kill succeeded, want error")
	}
	ids, err := b.Cleanup(t.Context())
	if err != nil {
		t.Errorf("Cleanup() = %v", err)
	}
	if slices.Contains(ids, s.ID()) {
		t.Errorf("Cleanup() = %v: Kill of the paused %s left it behind", ids, s.ID())
	}
}

func testCleanupPausedAfterCrash(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b1 := newBackend(t)
	s, p := createPausable(t, b1, rootfs)
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	// The daemon "crashes" with the sandbox paused.
	b2 := newBackend(t)
	ids, err := b2.Cleanup(t.Context())
	if err != nil {
		t.Fatalf("Cleanup() = %v", err)
	}
	if !slices.Contains(ids, s.ID()) {
		t.Errorf("Cleanup() = %v, want it to contain the paused %s", ids, s.ID())
	}
	if a, ok := isolation.As[isolation.Adopter](b2); ok {
		// A paused sandbox of such a backend has no process to end: it is
		// gone when nothing can bring it back.
		if s2, err := a.Adopt(t.Context(), s.ID(), Network(nil)); err == nil {
			s2.Kill(t.Context())
			t.Errorf("Adopt(%s) after Cleanup succeeded, want ErrNotFound", s.ID())
		} else if !errors.Is(err, isolation.ErrNotFound) {
			t.Errorf("Adopt(%s) after Cleanup = %v, want ErrNotFound", s.ID(), err)
		}
		if err := p.Resume(t.Context()); err == nil {
			t.Errorf("Resume() of the cleaned-up %s succeeded, want error", s.ID())
		}
		return
	}
	waitDone(t, s, "after Cleanup of a paused sandbox")
}

// RunPersistentPause runs the cases of backends whose paused sandboxes
// outlive their daemon (isolation.Adopter): a sandbox paused by one
// backend is adopted by the next on the same state and resumes with its
// processes and memory.
func RunPersistentPause(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string)
	}{
		{"AdoptResumes", testAdoptResumes},
		{"AdoptUnknown", testAdoptUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newBackend, rootfs) })
	}
}

func adopter(t *testing.T, b isolation.Backend) isolation.Adopter {
	t.Helper()
	a, ok := isolation.As[isolation.Adopter](b)
	if !ok {
		t.Fatalf("backend %T does not implement isolation.Adopter", b)
	}
	return a
}

func testAdoptResumes(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b1 := newBackend(t)
	s, p := createPausable(t, b1, rootfs)
	mustExec(t, s, "sh", "-c", "echo kept > /tmp/file && "+counterLoop)
	c1 := waitAdvance(t, s, waitAdvance(t, s, 0))
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	// The daemon "crashes" with the sandbox paused; the next one adopts it
	// before it cleans up.
	b2 := newBackend(t)
	s2, err := adopter(t, b2).Adopt(t.Context(), s.ID(), Network(nil))
	if err != nil {
		t.Fatalf("Adopt(%s) = %v", s.ID(), err)
	}
	t.Cleanup(func() { s2.Kill(context.WithoutCancel(t.Context())) })
	ids, err := b2.Cleanup(t.Context())
	if err != nil || slices.Contains(ids, s.ID()) {
		t.Fatalf("Cleanup() = %v, %v: it removed the adopted %s", ids, err, s.ID())
	}
	if c, err := s2.DialAgent(t.Context()); err == nil {
		c.Close()
		t.Errorf("DialAgent() of the adopted, paused sandbox succeeded, want ErrPaused")
	}
	p2, ok := isolation.As[isolation.Pauser](s2)
	if !ok {
		t.Fatalf("adopted sandbox %T does not implement isolation.Pauser", s2)
	}
	if err := p2.Resume(t.Context()); err != nil {
		t.Fatalf("Resume() of the adopted sandbox = %v", err)
	}
	c2 := readCounter(t, s2)
	t.Logf("counter: %d before the pause, %d after the restart and resume", c1, c2)
	if c2 < c1 || c2-c1 > 10 {
		t.Errorf("counter went from %d to %d: the loop's state was not kept", c1, c2)
	}
	waitAdvance(t, s2, c2) // the same loop runs on
	if got := mustExec(t, s2, "cat", "/tmp/file"); got != "kept\n" {
		t.Errorf("/tmp/file after the restart = %q, want kept", got)
	}
	if err := s2.Kill(t.Context()); err != nil {
		t.Fatalf("Kill() = %v", err)
	}
	waitDone(t, s2, "after Kill")
	ids, err = b2.Cleanup(t.Context())
	if err != nil || slices.Contains(ids, s.ID()) {
		t.Errorf("Cleanup() = %v, %v: Kill left %s behind", ids, err, s.ID())
	}
}

func testAdoptUnknown(t *testing.T, newBackend func(t *testing.T) isolation.Backend, rootfs string) {
	b := newBackend(t)
	a := adopter(t, b)
	// A running sandbox (no checkpoint) and an unknown ID cannot be adopted.
	s, _ := createPausable(t, b, rootfs)
	for _, id := range []string{s.ID(), "tnosuchsandbox0", "../etc"} {
		if s2, err := a.Adopt(t.Context(), id, Network(nil)); err == nil {
			s2.Kill(t.Context())
			t.Errorf("Adopt(%q) succeeded, want an error", id)
		}
	}
	if code, err := health(t.Context(), s); err != nil || code != http.StatusNoContent {
		t.Errorf("GET /health after failed adoptions = %d, %v; want 204", code, err)
	}
}
