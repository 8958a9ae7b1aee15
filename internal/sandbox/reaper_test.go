package sandbox

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// deadlineList is an expirer over bare deadlines: reap drops the ones due
// and notes when it ran.
type deadlineList struct {
	mu     sync.Mutex
	due    []time.Time
	reaped []time.Time
}

func (l *deadlineList) add(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.due = append(l.due, at)
}

func (l *deadlineList) nextDeadline() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.due) == 0 {
		return time.Time{}, false
	}
	return slices.MinFunc(l.due, func(a, b time.Time) int { return a.Compare(b) }), true
}

func (l *deadlineList) reap(context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.due = slices.DeleteFunc(l.due, func(at time.Time) bool { return !at.After(now) })
	l.reaped = append(l.reaped, now)
}

func (l *deadlineList) reapedAt() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reaped)
}

// TestReaperAlone: the reaper, on its own, wakes at a deadline it is told
// of with nudgeAt, does not see one it is not told of, finds that one
// once nudged to look at them all, and returns when stopped.
func TestReaperAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		l := &deadlineList{}
		r := newReaper()
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			r.run(stop, time.Now, l)
		}()
		synctest.Wait()
		l.add(start.Add(time.Minute))
		r.nudgeAt(start.Add(time.Minute))
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if got, want := l.reapedAt(), []time.Time{start.Add(time.Minute)}; !slices.Equal(got, want) {
			t.Fatalf("reaped at %v, want %v", got, want)
		}
		l.add(start.Add(3 * time.Minute)) // nobody tells the reaper
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if got := len(l.reapedAt()); got != 1 {
			t.Fatalf("reaped %d times before the nudge, want 1", got)
		}
		r.nudge()
		synctest.Wait()
		if got, want := l.reapedAt(), []time.Time{start.Add(time.Minute), start.Add(4 * time.Minute)}; !slices.Equal(got, want) {
			t.Fatalf("reaped at %v, want %v", got, want)
		}
		close(stop)
		<-done
	})
}
