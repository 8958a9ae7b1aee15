package approvals_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/approvals"
)

// waitPending waits until q has n pending requests and returns them.
func waitPending(t *testing.T, q *approvals.Queue, n int) []approvals.Request {
	t.Helper()
	for range 5000 {
		if l := q.List(nil); len(l) == n {
			return l
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("pending requests: %d, want %d", len(q.List(nil)), n)
	return nil
}

func TestDecideWakesHeldAsk(t *testing.T) {
	var applied, recorded []approvals.Request
	var mu sync.Mutex
	q := approvals.New(approvals.Options{
		Apply: func(_ context.Context, r approvals.Request) error {
			mu.Lock()
			applied = append(applied, r)
			mu.Unlock()
			return nil
		},
		Decided: func(r approvals.Request) { mu.Lock(); recorded = append(recorded, r); mu.Unlock() },
	})
	for i, d := range []approvals.Decision{approvals.Once, approvals.Sandbox, approvals.Deny} {
		got := make(chan approvals.Decision, 2)
		for range 2 { // the second lookup of the same name joins the first
			go func() {
				d, err := q.Ask(context.Background(), "sb1", "team1", "example.com")
				if err != nil {
					t.Error(err)
				}
				got <- d
			}()
		}
		reqs := waitPending(t, q, 1)
		for q.Stats().Joined < int64(i+1) {
			time.Sleep(time.Millisecond)
		}
		r, err := q.Decide(context.Background(), reqs[0].ID, d, "key:abc", nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Decision != d || r.Actor != "key:abc" || r.Name != "example.com" {
			t.Fatalf("decided %+v", r)
		}
		for range 2 {
			if g := <-got; g != d {
				t.Fatalf("Ask returned %q, want %q", g, d)
			}
		}
		if _, err := q.Decide(context.Background(), reqs[0].ID, approvals.Once, "key:abc", nil); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("second decision: %v, want not found", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 3 || len(recorded) != 3 || recorded[1].Decision != approvals.Sandbox || recorded[1].Actor != "key:abc" {
		t.Fatalf("applied %+v recorded %+v", applied, recorded)
	}
	if s := q.Stats(); s.Pending != 0 || s.Asked != 3 || s.Allowed != 2 || s.Denied != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestApplyErrorKeepsPending(t *testing.T) {
	q := approvals.New(approvals.Options{Apply: func(context.Context, approvals.Request) error {
		return fmt.Errorf("no team store: %w", api.ErrInvalidArgument)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan approvals.Decision)
	go func() { d, _ := q.Ask(ctx, "sb1", "", "example.com"); done <- d }()
	r := waitPending(t, q, 1)[0]
	if _, err := q.Decide(context.Background(), r.ID, approvals.Team, "key:abc", nil); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("Decide: %v", err)
	}
	if _, err := approvals.ParseDecision("maybe"); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("ParseDecision: %v", err)
	}
	if _, err := q.Decide(context.Background(), r.ID, "maybe", "key:abc", nil); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("Decide maybe: %v", err)
	}
	if _, err := q.Decide(context.Background(), r.ID, approvals.Once, "key:x", func(approvals.Request) bool { return false }); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("Decide of an invisible request: %v", err)
	}
	if n := len(q.List(nil)); n != 1 {
		t.Fatalf("pending after refused decisions: %d", n)
	}
	cancel()
	if d := <-done; d != approvals.Timeout {
		t.Fatalf("cancelled Ask: %q", d)
	}
	if s := q.Stats(); s.Pending != 0 || s.TimedOut != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestTimeoutCleansUp(t *testing.T) {
	var recorded []approvals.Request
	var mu sync.Mutex
	q := approvals.New(approvals.Options{Timeout: 20 * time.Millisecond,
		Decided: func(r approvals.Request) { mu.Lock(); recorded = append(recorded, r); mu.Unlock() }})
	d, err := q.Ask(context.Background(), "sb1", "", "example.com")
	if err != nil || d != approvals.Timeout || d.Allows() {
		t.Fatalf("Ask: %q %v", d, err)
	}
	if s := q.Stats(); s.Pending != 0 || s.TimedOut != 1 {
		t.Fatalf("stats %+v", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(recorded) != 1 || recorded[0].Decision != approvals.Timeout {
		t.Fatalf("recorded %+v", recorded)
	}
}

// A flood of new names from one sandbox costs at most PerSandbox requests;
// the rest are refused at once and counted, and another sandbox can still
// ask.
func TestFloodBounded(t *testing.T) {
	q := approvals.New(approvals.Options{PerSandbox: 16})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	full := 0
	for i := range 10000 {
		d, err := func() (approvals.Decision, error) {
			if i < 16 {
				wg.Add(1)
				go func() { defer wg.Done(); q.Ask(ctx, "flood", "", fmt.Sprintf("n%d.example.com", i)) }()
				waitPending(t, q, i+1)
				return "", nil
			}
			return q.Ask(ctx, "flood", "", fmt.Sprintf("n%d.example.com", i))
		}()
		if i >= 16 {
			if !errors.Is(err, approvals.ErrFull) || d.Allows() {
				t.Fatalf("ask %d: %q %v", i, d, err)
			}
			mu.Lock()
			full++
			mu.Unlock()
		}
	}
	if s := q.Stats(); s.Pending != 16 || s.Refused != 10000-16 || full != 10000-16 {
		t.Fatalf("stats %+v", s)
	}
	go q.Ask(ctx, "other", "", "example.com")
	waitPending(t, q, 17)
	q.Drop("flood")
	waitPending(t, q, 1)
	cancel()
	wg.Wait()
	waitPending(t, q, 0)
}

func TestSubscribe(t *testing.T) {
	q := approvals.New(approvals.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	ch := q.Subscribe(ctx)
	go q.Ask(context.Background(), "sb1", "", "example.com")
	ev := <-ch
	if ev.Type != "pending" || ev.Request.Name != "example.com" {
		t.Fatalf("event %+v", ev)
	}
	if _, err := q.Decide(context.Background(), ev.Request.ID, approvals.Deny, "key:a", nil); err != nil {
		t.Fatal(err)
	}
	if ev := <-ch; ev.Type != "decided" || ev.Request.Decision != approvals.Deny {
		t.Fatalf("event %+v", ev)
	}
	cancel()
	for range ch {
	}
}
