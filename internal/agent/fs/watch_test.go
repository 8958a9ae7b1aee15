package fs

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

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

// TestWatchRecursiveSeesFilesInNewDirs creates directories with files in
// them faster than the watcher can watch the new directories: every file
// is still reported as created.
func TestWatchRecursiveSeesFilesInNewDirs(t *testing.T) {
	var total atomic.Int64
	root := t.TempDir()
	w, err := newWatch(root, true, false, false, &total, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	var want []string
	for i := range 20 {
		dir := filepath.Join(root, fmt.Sprintf("d%d", i), "sub", "deeper")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "f.txt")
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		want = append(want, rel)
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		evs, _ := w.take()
		for _, e := range evs {
			if e.Type == pb.EventType_EVENT_TYPE_CREATE {
				seen[e.Name] = true
			}
		}
		missing := 0
		for _, f := range want {
			if !seen[f] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, f := range want {
		if !seen[f] {
			t.Errorf("no create event for %s", f)
		}
	}
}
