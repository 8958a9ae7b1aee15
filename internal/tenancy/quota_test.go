package tenancy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

func newQuotas(t *testing.T, d Limits) *Quotas {
	t.Helper()
	q, err := NewQuotas(nil, d)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// 50 concurrent admissions against a limit of 10 leave exactly 10, and
// the others get E2B's message.
func TestAdmitConcurrentNeverOvershoots(t *testing.T) {
	q := newQuotas(t, Limits{ConcurrentSandboxes: 10})
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for i := range 50 {
		wg.Go(func() {
			h, err := q.Admit("t1", Size{CPUs: 1})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				h.Commit(fmt.Sprint("sb", i))
				ok++
			case errors.Is(err, api.ErrResourceExhausted) &&
				strings.HasPrefix(err.Error(), "you have reached the maximum number of concurrent E2B sandboxes (10)"):
				refused++
			default:
				t.Errorf("Admit: %v", err)
			}
		})
	}
	wg.Wait()
	if ok != 10 || refused != 40 {
		t.Fatalf("admitted %d, refused %d; want 10, 40", ok, refused)
	}
	if u := q.Usage("t1"); u.Running != 10 || u.CPUs != 10 {
		t.Fatalf("usage %+v", u)
	}
	// Another team has its own count.
	if _, err := q.Admit("t2", Size{}); err != nil {
		t.Fatal(err)
	}
}

// Paused sandboxes leave the running count; a resume is refused at the
// running limit and a pause at the paused one; undo restores.
func TestPauseResumeCounts(t *testing.T) {
	q := newQuotas(t, Limits{ConcurrentSandboxes: 1, PausedSandboxes: 1})
	h, err := q.Admit("t", Size{MemoryMB: 100})
	if err != nil {
		t.Fatal(err)
	}
	h.Commit("a")
	if _, err := q.Pause("a"); err != nil {
		t.Fatal(err)
	}
	if u := q.Usage("t"); u != (Usage{Paused: 1}) {
		t.Fatalf("after pause: %+v", u)
	}
	h, err = q.Admit("t", Size{MemoryMB: 100})
	if err != nil {
		t.Fatalf("a paused sandbox counts as running: %v", err)
	}
	h.Commit("b")
	if _, err := q.Resume("a"); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("resume at the running limit: %v", err)
	}
	if _, err := q.Pause("b"); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("pause at the paused limit: %v", err)
	}
	q.Remove("b")
	undo, err := q.Resume("a")
	if err != nil {
		t.Fatal(err)
	}
	undo()
	undo()
	if u := q.Usage("t"); u != (Usage{Paused: 1}) {
		t.Fatalf("after an undone resume: %+v", u)
	}
	q.Remove("a")
	q.Remove("a")
	if u := q.Usage("t"); u != (Usage{}) {
		t.Fatalf("after removal: %+v", u)
	}
}

func TestHoldCancelAndSizeLimits(t *testing.T) {
	q := newQuotas(t, Limits{VCPUs: 2, MemoryMB: 1024, DiskMB: 100, MaxLifetimeSeconds: 60})
	h, err := q.Admit("t", Size{CPUs: 2, MemoryMB: 512})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Admit("t", Size{CPUs: 1}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("over the team's vCPUs: %v", err)
	}
	h.Cancel()
	h.Commit("x") // after Cancel: nothing
	if u := q.Usage("t"); u != (Usage{}) {
		t.Fatalf("after cancel: %+v", u)
	}
	for _, s := range []Size{{CPUs: 3}, {MemoryMB: 2048}, {DiskMB: 101}, {Timeout: time.Hour}} {
		if _, err := q.Admit("t", s); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Admit(%+v) = %v; want invalid argument", s, err)
		}
	}
	if u := q.Usage("t"); u != (Usage{}) {
		t.Fatalf("refusals changed the usage: %+v", u)
	}
}

type memLimits map[string]Limits

func (m memLimits) TeamLimits(context.Context) (map[string]Limits, error) { return m, nil }
func (m memLimits) SetTeamLimits(_ context.Context, team string, l Limits) error {
	m[team] = l
	return nil
}

func TestSetAndPatch(t *testing.T) {
	st := memLimits{}
	q, err := NewQuotas(st, Limits{ConcurrentSandboxes: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewQuotas(nil, Limits{Burst: -1}); err == nil {
		t.Fatal("negative defaults accepted")
	}
	for _, patch := range []string{`{"concurrentSandboxes":-1}`, `{"nope":1}`, `[1]`, `{"burst":1.5}`, `{"vcpus":"x"}`} {
		if _, err := q.Limits("t").Patch([]byte(patch)); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("Patch(%s) = %v; want invalid argument", patch, err)
		}
	}
	if err := q.Set(context.Background(), "t", Limits{ConcurrentSandboxes: -1}); !errors.Is(err, api.ErrInvalidArgument) || len(st) != 0 {
		t.Fatalf("Set(-1) = %v, store %v", err, st)
	}
	l, err := q.Limits("t").Patch([]byte(`{"concurrentSandboxes":1,"burst":3}`))
	if err != nil || l != (Limits{ConcurrentSandboxes: 1, Burst: 3}) {
		t.Fatalf("Patch = %+v, %v", l, err)
	}
	if err := q.Set(context.Background(), "t", l); err != nil {
		t.Fatal(err)
	}
	q2, _ := NewQuotas(st, Limits{ConcurrentSandboxes: 5})
	if err := q2.Load(context.Background()); err != nil || q2.Limits("t") != l || q2.Limits("u").ConcurrentSandboxes != 5 {
		t.Fatalf("loaded %+v, %v", q2.Limits("t"), err)
	}
}

func TestAllow(t *testing.T) {
	q := newQuotas(t, Limits{RequestsPerSecond: 0.5, Burst: 2})
	p := Principal{Team: "t", KeyID: "k"}
	now := time.Unix(1000, 0)
	for i := range 2 {
		if d := q.Allow(p, now); !d.Allowed || d.Limit != 2 || d.Remaining != 1-i {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	d := q.Allow(p, now)
	if d.Allowed || d.RetryAfter != 2*time.Second {
		t.Fatalf("third request: %+v", d)
	}
	if d := q.Allow(Principal{Team: "t", KeyID: "other"}, now); !d.Allowed {
		t.Fatal("another key shares the bucket")
	}
	if d := q.Allow(p, now.Add(2*time.Second)); !d.Allowed {
		t.Fatalf("after Retry-After: %+v", d)
	}
	if d := newQuotas(t, Limits{}).Allow(p, now); !d.Allowed || d.Limited {
		t.Fatalf("no limit: %+v", d)
	}
}

// Buckets full again go once there are many (a bucket made anew is
// full: nothing changes for their keys); a key in debt keeps its bucket.
func TestAllowPrunesIdleBuckets(t *testing.T) {
	q := newQuotas(t, Limits{RequestsPerSecond: 1, Burst: 1})
	if err := q.Set(t.Context(), "slow", Limits{RequestsPerSecond: 0.001, Burst: 1}); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	debtor := Principal{Team: "slow", KeyID: "k"}
	q.Allow(debtor, now)
	for i := range 3 * minPrune {
		q.Allow(Principal{Team: "t", KeyID: fmt.Sprint(i)}, now.Add(time.Duration(i)*time.Millisecond))
	}
	q.mu.Lock()
	n := len(q.buckets)
	q.mu.Unlock()
	if n >= 2*minPrune {
		t.Fatalf("%d buckets kept", n)
	}
	if d := q.Allow(debtor, now.Add(5*time.Second)); d.Allowed {
		t.Fatalf("a key in debt lost its bucket: %+v", d)
	}
}

func TestRunningCounts(t *testing.T) {
	q := newQuotas(t, Limits{})
	for i, team := range []string{"a", "a", "b"} {
		h, _ := q.Admit(team, Size{})
		h.Commit(fmt.Sprint(i))
	}
	q.Pause("2")
	if got := q.RunningCounts(); len(got) != 1 || got["a"] != 2 {
		t.Fatalf("RunningCounts = %v", got)
	}
}

func TestAdmitBuild(t *testing.T) {
	q := newQuotas(t, Limits{ConcurrentBuilds: 2})
	r1, err := q.AdmitBuild("t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.AdmitBuild("t"); err != nil {
		t.Fatal(err)
	}
	if _, err := q.AdmitBuild("t"); !errors.Is(err, api.ErrResourceExhausted) ||
		!strings.HasPrefix(err.Error(), "you have reached the maximum number of concurrent template builds (2)") {
		t.Fatalf("third build: %v", err)
	}
	if _, err := q.AdmitBuild("u"); err != nil {
		t.Fatalf("another team's build: %v", err)
	}
	r1()
	r1()
	if _, err := q.AdmitBuild("t"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := q.AdmitBuild("t"); err == nil {
		t.Fatal("a release given twice counted twice")
	}
}
