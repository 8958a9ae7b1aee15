package native_test

import (
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// maxIdleSandboxFDs is how many of the daemon's descriptors an idle native
// sandbox may hold: its init's pidfd, the lifeline (which carries its
// stderr), its uid slot's lock, its TUN device and its writable layer's
// root.
const maxIdleSandboxFDs = 5

// TestIdleSandboxDescriptors counts this process's descriptors (the
// daemon's, in a daemon) before and after creating idle sandboxes: each
// holds at most maxIdleSandboxFDs, and none is left once they are killed.
func TestIdleSandboxDescriptors(t *testing.T) {
	b := newBackend(t)
	// One created and killed first: what the backend opens once (its
	// spawner, the poller's) is not counted against the sandboxes.
	first := create(t, b, isolation.Spec{})
	if err := first.Kill(t.Context()); err != nil {
		t.Fatal(err)
	}
	before := openFDs(t)
	const n = 12
	var sbs []isolation.Sandbox
	for range n {
		sbs = append(sbs, create(t, b, isolation.Spec{}))
	}
	// Each answers a dial, and the connection is gone again.
	for _, sb := range sbs {
		c, err := sb.DialAgent(t.Context())
		if err != nil {
			t.Fatalf("DialAgent: %v", err)
		}
		c.Close()
	}
	after := openFDs(t)
	if per := float64(len(after)-len(before)) / n; per > maxIdleSandboxFDs {
		t.Errorf("an idle sandbox holds %.1f of the daemon's descriptors, want at most %d; with %d idle: %s",
			per, maxIdleSandboxFDs, n, fdKinds(after))
	}
	for _, sb := range sbs {
		if err := sb.Kill(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	// A killed sandbox is released in the background.
	deadline := time.Now().Add(30 * time.Second)
	left := openFDs(t)
	for len(left) > len(before) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		left = openFDs(t)
	}
	if len(left) > len(before) {
		t.Errorf("%d descriptors before the sandboxes, %d after they were killed: %s", len(before), len(left), fdKinds(left))
	}
}

// openFDs lists what this process's descriptors name.
func openFDs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			out = append(out, target)
		}
	}
	return out
}

// fdKinds counts descriptors by what they name, numbers left out.
func fdKinds(targets []string) string {
	digits := regexp.MustCompile(`[0-9]+`)
	count := map[string]int{}
	for _, t := range targets {
		count[digits.ReplaceAllString(t, "N")]++
	}
	var kinds []string
	for k, v := range count {
		kinds = append(kinds, fmt.Sprintf("%s: %d", k, v))
	}
	sort.Strings(kinds)
	return strings.Join(kinds, ", ")
}

// TestLifelineEndsSandbox: the agent ends its sandbox once the daemon's end
// of the lifeline (the socket that also carries its stderr) is closed, as
// it is when the daemon dies, with no Kill.
func TestLifelineEndsSandbox(t *testing.T) {
	b := newBackend(t)
	sb := create(t, b, isolation.Spec{})
	native.CutLifeline(sb)
	select {
	case <-sb.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox still runs 30 s after its lifeline was cut")
	}
}
