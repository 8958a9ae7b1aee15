package fs

import (
	"log/slog"
	"sync/atomic"
	"testing"

	pb "github.com/fencesandbox/fence/api/envd/filesystem"
)

// TestWatchOverflowReported proves that a watcher whose client does not
// take its events stops queueing at its bound, reports the loss, and gives
// its share of the agent-wide bound back.
func TestWatchOverflowReported(t *testing.T) {
	var total atomic.Int64
	w, err := newWatch(t.TempDir(), false, false, false, &total, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	for range maxQueuedEvents + 10 {
		w.push(&pb.FilesystemEvent{Name: "f"})
	}
	if total.Load() != 0 {
		t.Errorf("events counted after overflow = %d, want 0", total.Load())
	}
	evs, overflow := w.take()
	if !overflow || len(evs) != 0 {
		t.Errorf("take() after %d events = %d events, overflow %v; want the loss reported", maxQueuedEvents+10, len(evs), overflow)
	}
	// The agent-wide bound holds too.
	total.Store(maxTotalEvents)
	w2, err := newWatch(t.TempDir(), false, false, false, &total, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer w2.close()
	w2.push(&pb.FilesystemEvent{Name: "g"})
	if _, overflow := w2.take(); !overflow || total.Load() != maxTotalEvents {
		t.Errorf("push past the agent-wide bound: overflow %v, total %d; want true, %d", overflow, total.Load(), maxTotalEvents)
	}
}
