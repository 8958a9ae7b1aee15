package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func refused(sandbox, host string, path string) Event {
	return Event{Type: TypeGateway, SandboxID: sandbox, Actor: "sandbox",
		Data: map[string]any{"host": host, "method": "GET", "path": path, "decision": "deny", "reason": "host not allowed"}}
}

// TestFloodAllowance floods refused requests from one sandbox while the
// writer is held: the flooder's records beyond its allowance and its share
// of the queue are counted in an audit.suppressed record (every one of
// them: stored + suppressed = sent), a command of another sandbox is
// queued at once although the flooder filled what it may of the queue,
// another sandbox's refused request does not wait either, and the log
// verifies.
func TestFloodAllowance(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	l := openT(t, dir, func(o *Options) {
		o.Now = c.now
		o.NoSync = true
		o.QueueSize = 400
		o.BlockFor = time.Hour // a caller that has to wait for room hangs the test
		o.SandboxBurst = 1000
		o.SandboxRate = 100
	})
	ctx := context.Background()
	// Hold the writer: it stops before its next commit.
	l.syncMu.Lock()
	held := true
	defer func() {
		if held {
			l.syncMu.Unlock() // +checklocksignore: taken above while held
		}
	}()
	path := "/" + strings.Repeat("a", 60000)
	const sent = 5000
	for i := range sent {
		host := "x.test"
		if i%10 == 0 {
			host = "y.test"
		}
		l.Append(ctx, refused("flooder", host, path))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Append(ctx, Event{Type: TypeProcStart, SandboxID: "quiet", Actor: "key:ab", Data: map[string]any{"argv": []string{"make", "test"}}})
		l.Append(ctx, refused("quiet", "z.test", "/q"))
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("another sandbox's records waited for the flooder's to be written")
	}
	l.syncMu.Unlock()
	held = false
	c.add(11 * time.Second) // past SummaryEvery
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	stored := map[string]int{}
	var sum map[string]any
	var sums int
	var allSuppressed int64
	err := Export(ctx, dir, Filter{}, func(r *Record, line []byte) error {
		if r.Type == TypeSuppressed {
			var d struct{ Total int64 }
			json.Unmarshal(r.Data, &d)
			allSuppressed += d.Total
		}
		if r.Type == TypeSuppressed && r.Sandbox == "flooder" {
			sums++
			json.Unmarshal(r.Data, &sum)
		}
		if r.Type == TypeGateway || r.Type == TypeProcStart {
			stored[r.Sandbox+" "+r.Type]++
			if len(line) > 4<<10 {
				t.Errorf("a record of %d bytes: fields are not capped", len(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if stored["quiet process.start"] != 1 {
		t.Errorf("the quiet sandbox's command is not in the log: %v", stored)
	}
	got := stored["flooder gateway.request"]
	if got == 0 || got > 1000 {
		t.Errorf("%d of the flooder's records stored, want some and at most its burst of 1000", got)
	}
	if sums != 1 || sum == nil {
		t.Fatalf("%d summary records of the flooder", sums)
	}
	total := int64(sum["total"].(float64))
	if int64(got)+total != sent || l.Suppressed() < total {
		t.Errorf("stored %d + suppressed %d != sent %d (Suppressed %d)", got, total, sent, l.Suppressed())
	}
	var perHost int64
	for _, e := range sum["counts"].([]any) {
		m := e.(map[string]any)
		if m["type"] != TypeGateway || m["decision"] != "deny" || (m["host"] != "x.test" && m["host"] != "y.test") {
			t.Errorf("count %v", m)
		}
		perHost += int64(m["count"].(float64))
	}
	if perHost != total {
		t.Errorf("per-host counts %d, total %d", perHost, total)
	}
	if s, _ := sum["summary"].(string); !strings.Contains(s, "refused requests to x.test") {
		t.Errorf("summary %q", s)
	}
	t.Logf("stored %d, suppressed %d: %s", got, total, sum["summary"])
	// The quiet sandbox's refused request went in, or is counted in its
	// own summary: never lost, never waited for.
	if stored["quiet gateway.request"] != 1 {
		recs, _ := l.Query(ctx, Filter{Sandbox: "quiet", Types: []string{TypeSuppressed}})
		if len(recs) != 1 {
			t.Errorf("the quiet sandbox's refused request is neither stored nor counted")
		}
	}
	rep, err := Verify(dir, l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(rep.Warnings, "\n"), fmt.Sprintf("%d sandbox-driven events", allSuppressed)) {
		t.Errorf("warnings %v", rep.Warnings)
	}
}

// TestAllowanceRefills: after a flood, the allowance comes back at its
// rate, and a summary goes in once its window is SummaryEvery old without
// waiting for Close.
func TestAllowanceRefills(t *testing.T) {
	dir := t.TempDir()
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	l := openT(t, dir, func(o *Options) {
		o.Now = c.now
		o.NoSync = true
		o.SandboxBurst = 10
		o.SandboxRate = 1
		o.CheckpointInterval = 50 * time.Millisecond
	})
	ctx := context.Background()
	for range 30 {
		l.Append(ctx, refused("sb", "x.test", "/"))
	}
	c.add(5 * time.Second)
	for range 30 {
		l.Append(ctx, refused("sb", "x.test", "/"))
	}
	flush(t, l)
	c.add(6 * time.Second)
	deadline := time.Now().Add(30 * time.Second)
	var sums []Record
	for len(sums) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		sums, _ = l.Query(ctx, Filter{Sandbox: "sb", Types: []string{TypeSuppressed}})
	}
	if len(sums) != 1 {
		t.Fatalf("%d summaries before Close", len(sums))
	}
	recs, _ := l.Query(ctx, Filter{Sandbox: "sb", Types: []string{TypeGateway}})
	if len(recs) != 15 {
		t.Errorf("%d records stored, want the burst of 10 and 5 more after 5 s", len(recs))
	}
	var d struct {
		Total   int64  `json:"total"`
		Summary string `json:"summary"`
	}
	json.Unmarshal(sums[0].Data, &d)
	if d.Total != 45 || d.Summary != "45 refused requests to x.test in 5 s" {
		t.Errorf("summary %+v", d)
	}
}

func TestFieldCaps(t *testing.T) {
	d := map[string]any{"host": strings.Repeat("h", 1000), "method": strings.Repeat("M", 100), "path": "/" + strings.Repeat("é", 30000),
		"status": 403, "answers": []string{strings.Repeat("1", 5000)}, "short": "ok"}
	got := capFields(d, true)
	if len(d["path"].(string)) != 60001 {
		t.Fatal("the caller's map was changed")
	}
	if len(got["host"].(string)) != capName || len(got["method"].(string)) != capMethod || len(got["answers"].([]string)[0]) != capOther {
		t.Errorf("not capped: %v", got)
	}
	p := got["path"].(string)
	if len(p) > capPath || !strings.HasPrefix(p, "/é") || !json.Valid(mustJSON(p)) || strings.ContainsRune(p, '\uFFFD') {
		t.Errorf("path cut badly: %d bytes", len(p))
	}
	sizes := got["truncated"].(map[string]int)
	if sizes["path"] != 60001 || sizes["host"] != 1000 || sizes["method"] != 100 || got["short"] != "ok" || got["status"] != 403 {
		t.Errorf("sizes %v", sizes)
	}
	if got := capFields(map[string]any{"path": strings.Repeat("p", 5000)}, false); len(got["path"].(string)) != capPathCP {
		t.Errorf("a control-plane path cut to %d bytes", len(got["path"].(string)))
	}
	// A command's argv is control-plane: only named fields are capped.
	argv := []string{"python3", "-c", strings.Repeat("x", 10000)}
	if got := capFields(map[string]any{"argv": argv}, false); len(got["argv"].([]string)[2]) != 10000 {
		t.Error("a command's argv was cut")
	}
}

// TestQueueBytes: records waiting for the writer are bounded in bytes,
// and sandbox-driven ones take at most three quarters of that.
func TestQueueBytes(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, func(o *Options) {
		o.NoSync = true
		o.QueueBytes = 256 << 10
		o.SandboxBurst = 1 << 20
		o.BlockFor = time.Millisecond
	})
	ctx := context.Background()
	l.syncMu.Lock()
	big := strings.Repeat("d", 8000)
	for i := range 2000 {
		l.Append(ctx, refused(fmt.Sprintf("sb%d", i%7), "x.test", "/"+big[:1000]))
		l.Append(ctx, Event{Type: TypeFileWrite, SandboxID: "c", Data: map[string]any{"path": "/f", "note": big}})
		if q := l.queued.Load(); q > 256<<10+16<<10 {
			l.syncMu.Unlock()
			t.Fatalf("%d bytes queued", q)
		}
	}
	l.syncMu.Unlock()
	l.Close()
	if l.Dropped() == 0 || l.Suppressed() == 0 {
		t.Errorf("dropped %d, suppressed %d: the bound was never reached", l.Dropped(), l.Suppressed())
	}
	if _, err := Verify(dir, l.PublicKey()); err != nil {
		t.Fatal(err)
	}
}

// TestMaxBytes: past MaxBytes the oldest segments go, each after a prune
// record a checkpoint signs, and the log verifies.
func TestMaxBytes(t *testing.T) {
	dir := t.TempDir()
	const maxBytes = 256 << 10
	fill(t, dir, 6000, func(o *Options) { o.MaxBytes = maxBytes; o.NoSync = true })
	segs, _ := listSegments(filepath.Join(dir, LogDir))
	var total int64
	for _, s := range segs {
		st, _ := os.Stat(filepath.Join(dir, LogDir, s.name))
		total += st.Size()
	}
	if total > maxBytes+maxBytes/4 || len(segs) < 2 || segs[0].first == 1 {
		t.Fatalf("%d bytes in %d segments (first %v)", total, len(segs), segs[0])
	}
	pub := pubOf(t, dir)
	rep, err := Verify(dir, pub)
	if err != nil {
		t.Fatal(err)
	}
	if rep.FirstSeq != segs[0].first {
		t.Fatalf("report %+v", rep)
	}
	var prunes int
	err = Export(context.Background(), dir, Filter{Types: []string{TypePrune, TypeCheckpoint}}, func(r *Record, _ []byte) error {
		if r.Type == TypePrune {
			prunes++
			if !strings.Contains(string(r.Data), `"reason":"max-bytes"`) {
				t.Errorf("prune %s", r.Data)
			}
		}
		return nil
	})
	if err != nil || prunes == 0 {
		t.Fatalf("%d prune records kept, %v", prunes, err)
	}
	// Each prune record is followed at once by the checkpoint that signs it.
	var last *Record
	Export(context.Background(), dir, Filter{}, func(r *Record, _ []byte) error {
		if last != nil && last.Type == TypePrune && (r.Type != TypeCheckpoint || r.Seq != last.Seq+1) {
			t.Errorf("prune %d is followed by %s", last.Seq, r.Type)
		}
		c := *r
		last = &c
		return nil
	})
}

// TestVerifyRefusesForgedPrune: deleting the first records (a checkpoint
// among them) and appending a prune record made by hand that accounts
// for them is a break, not a warning.
func TestVerifyRefusesForgedPrune(t *testing.T) {
	for _, tc := range []string{"whole segments", "first lines"} {
		t.Run(tc, func(t *testing.T) {
			dir := t.TempDir()
			fill(t, dir, 3000, func(o *Options) { o.SegmentSize = 64 << 10; o.NoSync = true; o.CheckpointEvery = 100 })
			logDir := filepath.Join(dir, LogDir)
			segs, _ := listSegments(logDir)
			if len(segs) < 3 {
				t.Fatalf("%d segments", len(segs))
			}
			pub := pubOf(t, dir)
			if _, err := Verify(dir, pub); err != nil {
				t.Fatal(err)
			}
			var removed string
			var firstKept uint64
			var prev string
			switch tc {
			case "whole segments":
				removed = segs[0].name
				os.Remove(filepath.Join(logDir, segs[0].name))
				firstKept = segs[1].first
				var err error
				if prev, err = firstPrev(filepath.Join(logDir, segs[1].name)); err != nil {
					t.Fatal(err)
				}
			case "first lines":
				// Cut the first 250 lines (two checkpoints among them)
				// and name the file for its new first record.
				p := filepath.Join(logDir, segs[0].name)
				b, _ := os.ReadFile(p)
				lines := strings.SplitAfter(string(b), "\n")
				r, _ := parseLine([]byte(strings.TrimSuffix(lines[250], "\n")))
				os.Remove(p)
				firstKept, prev = r.Seq, r.Prev
				os.WriteFile(filepath.Join(logDir, segName(r.Seq)), []byte(strings.Join(lines[250:], "")), 0o600)
				removed = segName(1)
			}
			// Append the prune record at the end of the chain.
			segs, _ = listSegments(logDir)
			lastSeg := filepath.Join(logDir, segs[len(segs)-1].name)
			b, _ := os.ReadFile(lastSeg)
			lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
			lastLine := strings.TrimSuffix(lines[len(lines)-1], "\n")
			lr, _ := parseLine([]byte(lastLine))
			forged := line(nil, lr.Seq+1, body(time.Now(), TypePrune, "", "", mustJSON(map[string]any{
				"segment": removed, "first_kept": firstKept, "prev": prev})), hexHash([]byte(lastLine)))
			f, _ := os.OpenFile(lastSeg, os.O_APPEND|os.O_WRONLY, 0)
			f.Write(append(forged, '\n'))
			f.Close()

			rep, err := Verify(dir, pub)
			var brk *Break
			if !errors.As(err, &brk) || !strings.Contains(brk.Reason, "not signed by any later checkpoint") || brk.Seq != lr.Seq+1 {
				t.Fatalf("forged prune accepted: %v, %+v", err, rep)
			}
			t.Logf("detected: %v", brk)

			// A daemon started on it does not sign it: it records that it
			// found it unsigned, and verify still fails after its
			// checkpoints.
			l := openT(t, dir, func(o *Options) { o.NoSync = true })
			l.Append(context.Background(), Event{Type: TypeAPI, Data: map[string]any{"i": 1}})
			l.Close()
			rep, err = Verify(dir, pub)
			if !errors.As(err, &brk) || brk.Seq != lr.Seq+1 || !strings.Contains(brk.Reason, "unsigned when the daemon started") {
				t.Fatalf("forged prune accepted after a restart: %v, %+v", err, rep)
			}
		})
	}
}

// TestPruneCutShortByACrash: a prune record the daemon wrote without the
// checkpoint after it (a crash in between: the segment is still there)
// is noted at the next start, and the next prune of that segment, signed,
// accounts for the start: the log verifies.
func TestPruneCutShortByACrash(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 3000, func(o *Options) { o.SegmentSize = 64 << 10; o.NoSync = true })
	logDir := filepath.Join(dir, LogDir)
	segs, _ := listSegments(logDir)
	var total int64
	for _, s := range segs {
		st, _ := os.Stat(filepath.Join(logDir, s.name))
		total += st.Size()
	}
	st0, _ := os.Stat(filepath.Join(logDir, segs[0].name))
	prev, _ := firstPrev(filepath.Join(logDir, segs[1].name))
	lastSeg := filepath.Join(logDir, segs[len(segs)-1].name)
	b, _ := os.ReadFile(lastSeg)
	lines := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	lastLine := strings.TrimSuffix(lines[len(lines)-1], "\n")
	lr, _ := parseLine([]byte(lastLine))
	p := line(nil, lr.Seq+1, body(time.Now(), TypePrune, "", "", mustJSON(map[string]any{
		"segment": segs[0].name, "first_kept": segs[1].first, "prev": prev, "reason": "max-bytes", "bytes": st0.Size()})), hexHash([]byte(lastLine)))
	f, _ := os.OpenFile(lastSeg, os.O_APPEND|os.O_WRONLY, 0)
	f.Write(append(p, '\n'))
	f.Close()

	l := openT(t, dir, func(o *Options) { o.NoSync = true; o.MaxBytes = total - st0.Size() + 1024 })
	l.Close()
	after, _ := listSegments(logDir)
	if after[0] != segs[1] {
		t.Fatalf("segments after the restart: %v", after[:2])
	}
	rep, err := Verify(dir, pubOf(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(rep.Warnings, "\n"), "a prune record no checkpoint signed") {
		t.Errorf("warnings %v", rep.Warnings)
	}
}

// TestVerifyPruneAgreesWithSegmentNames: a pruned log whose first segment
// was renamed (as if records had been cut from it and the file named for
// the new first one) does not verify.
func TestVerifyPruneAgreesWithSegmentNames(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 6000, func(o *Options) { o.MaxBytes = 256 << 10; o.NoSync = true })
	logDir := filepath.Join(dir, LogDir)
	segs, _ := listSegments(logDir)
	if segs[0].first == 1 {
		t.Fatal("nothing pruned")
	}
	os.Rename(filepath.Join(logDir, segs[0].name), filepath.Join(logDir, segName(segs[0].first-1)))
	_, err := Verify(dir, pubOf(t, dir))
	var brk *Break
	if !errors.As(err, &brk) || !strings.Contains(brk.Reason, "does not agree with the segment names") {
		t.Fatalf("a renamed first segment verified: %v", err)
	}
}
