package integration

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/capacity"
)

// pidsParent is the directory of the daemon's native cgroup parent that
// holds pids.max: fence/<instance> on the pids hierarchy (v1) or the
// unified one (v2).
func pidsParent(t *testing.T, dataDir string) string {
	t.Helper()
	for _, dir := range cgroupRoots(instanceOf(dataDir)) {
		if _, err := os.Stat(filepath.Join(dir, "pids.max")); err == nil {
			return dir
		}
	}
	t.Fatalf("no pids.max in the cgroups of %s", instanceOf(dataDir))
	return ""
}

func readCount(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

// TestCapacityRefusesWhatItCannotHold makes the node small with a real
// limit, the pids.max of the cgroup that holds the daemon's sandboxes,
// set to room for about three more: creates past it answer 503 with
// E2B's error shape naming the limit (the warm pool's sandbox given back
// first), so does the resume of a sandbox paused without its memory (which
// stays paused), every sandbox created before still answers an exec and a
// file read, /health and /metrics show it, and once the limit is lifted the
// daemon creates again; a kill of every sandbox leaves nothing behind.
func TestCapacityRefusesWhatItCannotHold(t *testing.T) {
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir, "--warm-pool", "1")
	// One sandbox paused without its memory: its resume boots it again.
	ctx := ctxT(t)
	cold, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	sh(t, cold.Envd(), "echo kept > /tmp/kept")
	if err := d.Client.PauseWithoutMemory(ctx, cold.ID()); err != nil {
		t.Fatalf("PauseWithoutMemory: %v", err)
	}
	eventually(t, 60*time.Second, "the warm pool fills", func() bool { return len(hostSandboxes(d.DataDir)) == 1 })
	dir := pidsParent(t, dataDir)
	max := filepath.Join(dir, "pids.max")
	t.Cleanup(func() { os.WriteFile(max, []byte("max"), 0o644) })
	cur := readCount(t, filepath.Join(dir, "pids.current"))
	per := capacity.PerSandbox[capacity.GroupTasks]
	limit := cur + capacity.SafetyMargin[capacity.GroupTasks] + 3*per + per/2
	if err := os.WriteFile(max, []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatalf("setting pids.max: %v", err)
	}

	var boxes []*client.Sandbox
	var refusal *client.Error
	for range 12 {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
		cancel()
		if err != nil {
			if !errors.As(err, &refusal) {
				t.Fatalf("create %d: %v, want a refusal or a sandbox", len(boxes)+1, err)
			}
			break
		}
		boxes = append(boxes, sb)
	}
	if refusal == nil {
		t.Fatalf("%d creates against pids.max %d (%d in use before) were all admitted", len(boxes), limit, cur)
	}
	if len(boxes) == 0 {
		t.Fatalf("the first create was refused: %v", refusal)
	}
	if refusal.Status != 503 || refusal.Code != 503 || !strings.HasPrefix(refusal.Message, "node at capacity: ") ||
		!strings.Contains(refusal.Message, "of fence's cgroup pids.max "+strconv.FormatInt(limit, 10)+" tasks in use") {
		t.Errorf("refusal = %d %d %q, want 503 naming fence's cgroup pids.max %d", refusal.Status, refusal.Code, refusal.Message, limit)
	}
	t.Logf("%d sandboxes admitted, then: %s", len(boxes), refusal.Message)

	// Every sandbox admitted before answers.
	for i, sb := range boxes {
		if out := sh(t, sb.Envd(), "echo ok-"+strconv.Itoa(i)+" > /tmp/f && cat /tmp/f"); out != "ok-"+strconv.Itoa(i)+"\n" {
			t.Errorf("sandbox %d: exec = %q", i, out)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		rc, err := sb.Envd().ReadFile(ctx, "/tmp/f")
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			if string(b) != "ok-"+strconv.Itoa(i)+"\n" {
				t.Errorf("sandbox %d: read = %q", i, b)
			}
		} else {
			t.Errorf("sandbox %d: read: %v", i, err)
		}
		cancel()
	}

	// The refused create took the warm pool's sandbox back; once its kill
	// has freed its tasks there can be room for one more sandbox. Fill it,
	// so that the node holds nothing it could give back when the resume
	// below asks (the pool refills only with two creates' room to spare).
	eventually(t, 60*time.Second, "the pool's sandbox given back is gone",
		func() bool { return len(hostSandboxes(d.DataDir)) == len(boxes) })
	for range 4 {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
		cancel()
		var again *client.Error
		if errors.As(err, &again) && again.Status == 503 {
			break
		}
		if err != nil {
			t.Fatalf("create after the pool gave back: %v, want a refusal or a sandbox", err)
		}
		boxes = append(boxes, sb)
	}

	// The sandbox paused without memory stays paused rather than boot.
	_, err = d.Client.Connect(ctx, cold.ID(), time.Minute)
	var resumeRefusal *client.Error
	if !errors.As(err, &resumeRefusal) || resumeRefusal.Status != 503 || !strings.Contains(resumeRefusal.Message, "node at capacity: ") {
		t.Errorf("resume at capacity = %v, want 503 node at capacity", err)
	}
	if info, err := d.Client.Get(ctx, cold.ID()); err != nil || info.State != "paused" {
		t.Errorf("after the refused resume: %+v, %v; want it paused", info, err)
	}

	// /health and /metrics publish it.
	r := d.do(t, "GET", "/health", "", nil, nil)
	var health struct {
		Code     int
		Capacity *struct {
			Sandboxes int64
			Limit     string
		}
	}
	if err := json.Unmarshal(r.Body, &health); err != nil || r.Status != 200 || health.Capacity == nil ||
		health.Capacity.Sandboxes != 0 || health.Capacity.Limit != string(capacity.GroupTasks) {
		t.Errorf("GET /health at capacity = %d %s, want 200 with capacity 0 on cgroup_pids", r.Status, r.Body)
	}
	r = d.do(t, "GET", "/metrics", d.Key, nil, nil)
	if !strings.Contains(string(r.Body), `fence_capacity_refused_total{limit="cgroup_pids"} `) ||
		strings.Contains(string(r.Body), `fence_capacity_refused_total{limit="cgroup_pids"} 0`) {
		t.Errorf("GET /metrics has no count of the refusal:\n%s", r.Body)
	}

	// Lifted, the node creates again.
	if err := os.WriteFile(max, []byte("max"), 0o644); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	more, err := d.Client.Create(cctx, api.NewSandbox{TemplateID: "minimal"})
	cancel()
	if err != nil {
		t.Fatalf("create after the limit is lifted: %v", err)
	}
	if out := sh(t, more.Envd(), "echo again"); out != "again\n" {
		t.Errorf("exec after the limit is lifted = %q", out)
	}
	boxes = append(boxes, more)
	resumed, err := d.Client.Connect(ctx, cold.ID(), time.Minute)
	if err != nil {
		t.Fatalf("resume after the limit is lifted: %v", err)
	}
	if out := sh(t, resumed.Envd(), "cat /tmp/kept"); out != "kept\n" {
		t.Errorf("resumed sandbox's file = %q", out)
	}
	boxes = append(boxes, resumed)
	for _, sb := range boxes {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		if err := sb.Kill(ctx); err != nil {
			t.Errorf("Kill(%s): %v", sb.ID(), err)
		}
		cancel()
	}
	ours := d.sandboxIDs()
	d.Stop()
	assertNoLeftovers(t, dataDir, ours)
}
