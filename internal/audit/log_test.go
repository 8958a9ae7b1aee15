package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func openT(t testing.TB, dir string, mod func(*Options)) *Log {
	t.Helper()
	o := Options{Dir: dir}
	if mod != nil {
		mod(&o)
	}
	l, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func flush(t testing.TB, l *Log) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func pubOf(t testing.TB, dir string) ed25519.PublicKey {
	t.Helper()
	k, err := LoadPublicKey(filepath.Join(dir, PubFile))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fill writes n events over three sandboxes and closes the log.
func fill(t testing.TB, dir string, n int, mod func(*Options)) {
	t.Helper()
	l := openT(t, dir, mod)
	for i := range n {
		l.Append(context.Background(), Event{Type: TypeProcStart, SandboxID: fmt.Sprintf("sb%d", i%3), Actor: "daemon",
			Data: map[string]any{"i": i, "argv": []string{"echo", "hi"}}})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestAppendQueryVerify(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 2500, func(o *Options) { o.CheckpointEvery = 1000 })
	rep, err := Verify(dir, pubOf(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	// 2500 events, a checkpoint after each 1000 and one over the tail.
	if rep.Records != 2503 || rep.Checkpoints != 3 || rep.Unsigned != 0 || rep.FirstSeq != 1 || rep.LastSeq != 2503 {
		t.Fatalf("report %+v", rep)
	}
	if len(rep.Warnings) != 0 {
		t.Fatalf("warnings on an intact log: %v", rep.Warnings)
	}
	st, err := os.Stat(filepath.Join(dir, LogDir))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("log dir mode %v %v", st.Mode(), err)
	}
	segs, _ := listSegments(filepath.Join(dir, LogDir))
	for _, s := range segs {
		st, _ := os.Stat(filepath.Join(dir, LogDir, s.name))
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("segment %s mode %v", s.name, st.Mode())
		}
	}

	l := openT(t, dir, nil)
	ctx := context.Background()
	got, err := l.Query(ctx, Filter{Sandbox: "sb1", Types: []string{TypeProcStart}, Limit: 5})
	if err != nil || len(got) != 5 {
		t.Fatalf("query: %d %v", len(got), err)
	}
	for _, r := range got {
		if r.Sandbox != "sb1" || r.Type != TypeProcStart {
			t.Fatalf("filter let through %+v", r)
		}
	}
	after, _ := l.Query(ctx, Filter{After: got[4].Seq, Sandbox: "sb1", Limit: 1})
	if len(after) != 1 || after[0].Seq <= got[4].Seq {
		t.Fatalf("after: %+v", after)
	}
	desc, _ := l.Query(ctx, Filter{Sandbox: "sb2", Desc: true, Limit: 3})
	if len(desc) != 3 || desc[0].Seq < desc[1].Seq {
		t.Fatalf("desc: %+v", desc)
	}
	var d struct{ I int }
	json.Unmarshal(desc[0].Data, &d)
	if d.I != 2498 {
		t.Fatalf("newest sb2 record is i=%d, want 2498", d.I)
	}
	cps, _ := l.Query(ctx, Filter{Types: []string{TypeCheckpoint}})
	if len(cps) != 3 {
		t.Fatalf("%d checkpoints", len(cps))
	}
	future, _ := l.Query(ctx, Filter{Since: time.Now().Add(time.Hour)})
	if len(future) != 0 {
		t.Fatalf("since the future: %d records", len(future))
	}
	var n int
	if err := Export(ctx, dir, Filter{Sandbox: "sb0"}, func(r *Record, line []byte) error {
		if hexHash(line) == "" || !bytes.HasPrefix(line, []byte(`{"seq":`)) {
			t.Fatalf("line %q", line)
		}
		n++
		return nil
	}); err != nil || n != 834 {
		t.Fatalf("export: %d records, %v", n, err)
	}
}

// readLines returns the lines of the log's only segment.
func segLines(t *testing.T, dir string) (string, [][]byte) {
	t.Helper()
	segs, err := listSegments(filepath.Join(dir, LogDir))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v %v", segs, err)
	}
	p := filepath.Join(dir, LogDir, segs[0].name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, bytes.SplitAfter(b, []byte("\n"))
}

func writeLines(t *testing.T, p string, lines [][]byte) {
	t.Helper()
	if err := os.WriteFile(p, bytes.Join(lines, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

// resign recomputes the chain of lines from the first one, as an attacker
// without the daemon's key would: prevs are rehashed and checkpoints are
// signed with key.
func resign(t *testing.T, lines [][]byte, key ed25519.PrivateKey) [][]byte {
	t.Helper()
	prev := genesis
	var out [][]byte
	var prevSeq uint64
	for _, l := range lines {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		r, _ := parseLine(bytes.TrimSuffix(l, []byte("\n")))
		body := body(r.Time, r.Type, r.Sandbox, r.Actor, r.Data)
		if r.Type == TypeCheckpoint {
			h, _ := hex.DecodeString(prev)
			sig := ed25519.Sign(key, checkpointMessage(prevSeq, h))
			body = bodyOf(r, map[string]any{"seq": prevSeq, "hash": prev, "sig": base64.StdEncoding.EncodeToString(sig), "key": keyID(key.Public().(ed25519.PublicKey))})
		}
		nl := line(nil, r.Seq, body, prev)
		prev = hexHash(nl)
		prevSeq = r.Seq
		out = append(out, append(nl, '\n'))
	}
	return out
}

func bodyOf(r Record, data map[string]any) []byte {
	return body(r.Time, r.Type, r.Sandbox, r.Actor, mustJSON(data))
}

func TestVerifyDetectsTampering(t *testing.T) {
	base := t.TempDir()
	fill(t, base, 40, func(o *Options) { o.CheckpointEvery = 10 })
	_, orig := segLines(t, base)
	otherKey := func() ed25519.PrivateKey {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		return k
	}()
	tests := []struct {
		name    string
		tamper  func(lines [][]byte) [][]byte
		seq     uint64
		line    int
		reason  string
		headDel bool
	}{
		{"edit a byte of a record", func(ls [][]byte) [][]byte {
			ls[4] = bytes.Replace(ls[4], []byte("echo"), []byte("ech0"), 1)
			return ls
		}, 5, 5, "record 5 was altered", false},
		{"edit the prev of a record", func(ls [][]byte) [][]byte {
			i := bytes.Index(ls[6], []byte(`"prev":"`)) + len(`"prev":"`)
			ls[6] = bytes.Clone(ls[6])
			if ls[6][i] == '0' {
				ls[6][i] = '1'
			} else {
				ls[6][i] = '0'
			}
			return ls
		}, 7, 7, "record 7 was altered", false},
		{"delete a line", func(ls [][]byte) [][]byte {
			return append(ls[:7:7], ls[8:]...)
		}, 8, 8, "records 8 to 8 are missing here", false},
		{"swap two lines", func(ls [][]byte) [][]byte {
			ls[12], ls[13] = ls[13], ls[12]
			return ls
		}, 13, 13, "records 13 to 13 are missing here (deleted, or moved): found seq 14", false},
		{"not JSON", func(ls [][]byte) [][]byte {
			ls[2] = []byte("garbage\n")
			return ls
		}, 3, 3, "not a well-formed record", false},
		{"truncate the tail past checkpoints", func(ls [][]byte) [][]byte {
			return ls[:20]
		}, 20, 20, "records were removed from the end", false},
		{"rewrite the chain with another key", func(ls [][]byte) [][]byte {
			ls[2] = bytes.Replace(ls[2], []byte("echo"), []byte("ech0"), 1)
			return resign(t, ls, otherKey)
		}, 11, 11, "signed by key", false},
		{"forge a checkpoint signature under the right key id", func(ls [][]byte) [][]byte {
			ls = resign(t, ls, otherKey)
			// Claim the daemon's key id in every checkpoint.
			good := keyID(pubOf(t, base))
			for i := range ls {
				ls[i] = bytes.ReplaceAll(ls[i], []byte(keyID(otherKey.Public().(ed25519.PublicKey))), []byte(good))
			}
			return resign2(t, ls)
		}, 11, 11, "signature does not verify", false},
		{"delete the first lines", func(ls [][]byte) [][]byte {
			return ls[5:]
		}, 6, 1, "records before seq 6 are missing", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			copyDir(t, base, dir)
			p, lines := segLines(t, dir)
			if len(lines) != len(orig) {
				t.Fatal("copy differs")
			}
			if lines[len(lines)-1] == nil || len(lines[len(lines)-1]) == 0 {
				lines = lines[:len(lines)-1]
			}
			writeLines(t, p, tt.tamper(lines))
			rep, err := Verify(dir, pubOf(t, base))
			var b *Break
			if !errors.As(err, &b) {
				t.Fatalf("tampering not detected: %v, report %+v", err, rep)
			}
			if b.Seq != tt.seq || b.Line != tt.line || !strings.Contains(b.Reason, tt.reason) {
				t.Fatalf("break %+v, want seq %d line %d %q", b, tt.seq, tt.line, tt.reason)
			}
			t.Logf("detected: %v", b)
		})
	}
}

// resign2 re-chains lines without touching checkpoint data (whose
// signatures the caller forged).
func resign2(t *testing.T, lines [][]byte) [][]byte {
	prev := genesis
	var out [][]byte
	for _, l := range lines {
		r, err := parseLine(bytes.TrimSuffix(l, []byte("\n")))
		if err != nil {
			t.Fatal(err)
		}
		var d map[string]any
		json.Unmarshal(r.Data, &d)
		if r.Type == TypeCheckpoint {
			d["hash"] = prev
		}
		nl := line(nil, r.Seq, body(r.Time, r.Type, r.Sandbox, r.Actor, mustJSON(d)), prev)
		prev = hexHash(nl)
		out = append(out, append(nl, '\n'))
	}
	return out
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestUnsignedTailAndTornLine(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, nil)
	for i := range 5 {
		l.Append(context.Background(), Event{Type: TypeAPI, Data: map[string]any{"i": i}})
	}
	flush(t, l)
	// A copy taken while the daemon runs: no checkpoint yet.
	snap := t.TempDir()
	copyDir(t, dir, snap)
	rep, err := Verify(snap, l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Unsigned != 5 || !strings.Contains(strings.Join(rep.Warnings, "\n"), "records after the last checkpoint are unsigned") {
		t.Fatalf("report %+v", rep)
	}
	// A torn final line, as a crash in the middle of a write leaves it.
	p, _ := segLines(t, snap)
	f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":6,"time":"2026-`)
	f.Close()
	if _, err := Verify(snap, l.PublicKey()); err != nil {
		t.Fatalf("a torn tail is not tampering: %v", err)
	}
	l2 := openT(t, snap, nil)
	l2.Append(context.Background(), Event{Type: TypeAPI})
	l2.Close()
	rep, err = Verify(snap, l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	recs, _ := l2.Query(context.Background(), Filter{Types: []string{TypeRecovered}})
	if len(recs) != 1 || recs[0].Seq != 6 || rep.LastSeq != 8 || rep.Unsigned != 0 {
		t.Fatalf("recovered records %+v, report %+v", recs, rep)
	}
}

func TestConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, func(o *Options) { o.SegmentSize = 256 << 10 })
	var wg sync.WaitGroup
	const writers, each = 8, 5000
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Append(context.Background(), Event{Type: TypeProcStart, SandboxID: fmt.Sprintf("w%d", w), Data: map[string]any{"i": i}})
			}
		})
	}
	wg.Wait()
	l.Close()
	rep, err := Verify(dir, l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if l.Dropped() != 0 {
		t.Fatalf("%d dropped", l.Dropped())
	}
	got := 0
	Export(context.Background(), dir, Filter{Types: []string{TypeProcStart}}, func(r *Record, _ []byte) error { got++; return nil })
	if got != writers*each || rep.Segments < 2 {
		t.Fatalf("%d records over %d segments", got, rep.Segments)
	}
	// Queries skip sealed segments by their index, with the same answer.
	l2 := openT(t, dir, nil)
	for range 2 {
		recs, err := l2.Query(context.Background(), Filter{Sandbox: "w3"})
		if err != nil || len(recs) != each {
			t.Fatalf("w3: %d records, %v", len(recs), err)
		}
		if recs, _ := l2.Query(context.Background(), Filter{Sandbox: "nobody"}); len(recs) != 0 {
			t.Fatalf("nobody: %d records", len(recs))
		}
		if recs, _ := l2.Query(context.Background(), Filter{Since: time.Now().Add(-time.Hour), Types: []string{TypeProcStart}}); len(recs) != writers*each {
			t.Fatalf("since an hour: %d records", len(recs))
		}
	}
	// Each writer's records are in its own order.
	for w := range writers {
		last := -1
		Export(context.Background(), dir, Filter{Sandbox: fmt.Sprintf("w%d", w)}, func(r *Record, _ []byte) error {
			var d struct{ I int }
			json.Unmarshal(r.Data, &d)
			if d.I != last+1 {
				t.Fatalf("writer %d: %d after %d", w, d.I, last)
			}
			last = d.I
			return nil
		})
	}
}

func TestDropWhenQueueFull(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, func(o *Options) { o.QueueSize = 1; o.BlockFor = time.Millisecond; o.MaxBatch = 1 })
	for range 2000 {
		l.Append(context.Background(), Event{Type: TypeAPI})
	}
	l.Close()
	if l.Dropped() == 0 {
		t.Skip("the writer kept up with a queue of one; nothing to check")
	}
	rep, err := Verify(dir, l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(rep.Warnings, "\n"), fmt.Sprintf("%d events were dropped", l.Dropped())) {
		t.Fatalf("drops not recorded: %v", rep.Warnings)
	}
}

func TestSubscribe(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, func(o *Options) { o.NoSync = true })
	sub := l.Subscribe(Filter{Sandbox: "a"}, 16)
	defer sub.Close()
	l.Append(context.Background(), Event{Type: TypeAPI, SandboxID: "b"})
	l.Append(context.Background(), Event{Type: TypeAPI, SandboxID: "a", Data: map[string]any{"n": 1}})
	select {
	case r := <-sub.C:
		if r.Sandbox != "a" || r.Seq != 2 {
			t.Fatalf("got %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no record")
	}
	// A subscriber that never reads is cut off; the writer goes on.
	slow := l.Subscribe(Filter{}, 4)
	for range 100 {
		l.Append(context.Background(), Event{Type: TypeAPI})
	}
	flush(t, l)
	n := 0
	for range slow.C {
		n++
	}
	if !errors.Is(slow.Err(), ErrSlow) || n != 4 {
		t.Fatalf("slow subscriber: %d records, %v", n, slow.Err())
	}
	if l.Committed() < 102 {
		t.Fatalf("committed %d", l.Committed())
	}
}

func TestOutputBounds(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, func(o *Options) { o.OutputPerProcess = 1000; o.OutputPerSandbox = 2500; o.NoSync = true })
	data := bytes.Repeat([]byte("0123456789"), 150) // 1500 bytes
	var sums []OutputSum
	for pid := range 4 {
		o, err := l.Output("sbx", 100+pid, "stdout")
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(data); i += 70 {
			if n, err := o.Write(data[i:min(i+70, len(data))]); err != nil || n != min(70, len(data)-i) {
				t.Fatal(n, err)
			}
		}
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
		sums = append(sums, o.Sum())
	}
	full := sha256.Sum256(data)
	wantKept := []int64{1000, 1000, 500, 0}
	for i, s := range sums {
		if s.Size != 1500 || s.SHA256 != hex.EncodeToString(full[:]) || s.Kept != wantKept[i] {
			t.Fatalf("stream %d: %+v", i, s)
		}
		b, err := os.ReadFile(filepath.Join(dir, s.Path))
		if err != nil || !bytes.Equal(b, data[:s.Kept]) {
			t.Fatalf("stream %d kept %d bytes (%v), want the first %d", i, len(b), err, s.Kept)
		}
		st, _ := os.Stat(filepath.Join(dir, s.Path))
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("mode %v", st.Mode())
		}
	}
	if _, err := l.Output("../x", 1, "stdout"); err == nil {
		t.Fatal("a sandbox ID with a path in it was accepted")
	}
	// Another sandbox has its own budget.
	o, _ := l.Output("other", 1, "stderr")
	o.Write(data)
	o.Close()
	if o.Sum().Kept != 1000 {
		t.Fatalf("other sandbox kept %d", o.Sum().Kept)
	}
}

func TestRetention(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 3000, func(o *Options) { o.SegmentSize = 64 << 10; o.NoSync = true })
	segs, _ := listSegments(filepath.Join(dir, LogDir))
	if len(segs) < 4 {
		t.Fatalf("%d segments", len(segs))
	}
	old := time.Now().Add(-10 * 24 * time.Hour)
	for _, s := range segs[:2] {
		os.Chtimes(filepath.Join(dir, LogDir, s.name), old, old)
	}
	// An old output file goes too.
	os.MkdirAll(filepath.Join(dir, LogDir, outputDir, "sbx"), 0o700)
	outFile := filepath.Join(dir, LogDir, outputDir, "sbx", "1-1-1.stdout")
	os.WriteFile(outFile, []byte("x"), 0o600)
	os.Chtimes(outFile, old, old)
	l := openT(t, dir, nil)
	l.Close()
	after, _ := listSegments(filepath.Join(dir, LogDir))
	if len(after) != len(segs)-2 || after[0] != segs[2] {
		t.Fatalf("segments after retention: %v (before %v)", after, segs)
	}
	if _, err := os.Stat(outFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("old output kept: %v", err)
	}
	rep, err := Verify(dir, l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if rep.FirstSeq != segs[2].first {
		t.Fatalf("report %+v", rep)
	}
	// Removing one more segment by hand is noticed.
	os.Remove(filepath.Join(dir, LogDir, after[0].name))
	if _, err := Verify(dir, l.PublicKey()); err == nil || !strings.Contains(err.Error(), "no prune record accounts") {
		t.Fatalf("segment removed by hand: %v", err)
	}
}

func TestKeyRefused(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, KeyFile), []byte(strings.Repeat("ab", 32)+"\n"), 0o644)
	if _, err := Open(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "group and others must have no access") {
		t.Fatalf("a 0644 key: %v", err)
	}
	dir2 := t.TempDir()
	os.WriteFile(filepath.Join(dir2, "k"), []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
	os.Symlink(filepath.Join(dir2, "k"), filepath.Join(dir2, KeyFile))
	if _, err := Open(Options{Dir: dir2}); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("a symlinked key: %v", err)
	}
	dir3 := t.TempDir()
	l := openT(t, dir3, nil)
	st, err := os.Stat(filepath.Join(dir3, KeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("new key: %v %v", st, err)
	}
	if !pubOf(t, dir3).Equal(l.PublicKey()) {
		t.Fatal("audit.pub is not the key's")
	}
}

// TestKillChild is the child of TestKill9: it appends in a loop and
// reports what Flush confirmed, until it is killed.
func TestKillChild(t *testing.T) {
	dir := os.Getenv("FENCE_AUDIT_KILL_CHILD")
	if dir == "" {
		t.Skip("the child of TestKill9")
	}
	l, err := Open(Options{Dir: dir, CheckpointEvery: 500})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				l.Append(context.Background(), Event{Type: TypeFlow, SandboxID: fmt.Sprintf("w%d", w), Data: map[string]any{"i": i}})
			}
		})
	}
	for {
		if err := l.Flush(context.Background()); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("committed", l.Committed())
	}
}

// TestKill9 kills a process appending to the log with SIGKILL, several
// times: each time the log verifies, every record Flush confirmed is
// there, and the next Open continues the chain.
func TestKill9(t *testing.T) {
	dir := t.TempDir()
	var confirmed uint64
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "FENCE_AUDIT_KILL_CHILD="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		target := confirmed + 5000
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 2 && f[0] == "committed" {
				n, _ := strconv.ParseUint(f[1], 10, 64)
				confirmed = max(confirmed, n)
				if confirmed >= target {
					break
				}
			} else if len(f) > 0 && f[0] == "error" {
				t.Fatal(sc.Text())
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		go io.Copy(io.Discard, out)
		cmd.Wait()
		rep, err := Verify(dir, pubOf(t, dir))
		if err != nil {
			t.Fatalf("round %d: after SIGKILL: %v", round, err)
		}
		if rep.LastSeq < confirmed {
			t.Fatalf("round %d: the log ends at %d but %d was confirmed", round, rep.LastSeq, confirmed)
		}
		t.Logf("round %d: killed with %d records on disk (%d confirmed), %d unsigned, warnings %v", round, rep.LastSeq, confirmed, rep.Unsigned, rep.Warnings)
	}
	l := openT(t, dir, nil)
	before := l.Committed()
	l.Append(context.Background(), Event{Type: TypeAPI})
	l.Close()
	rep, err := Verify(dir, l.PublicKey())
	if err != nil || rep.LastSeq <= before || rep.Unsigned != 0 {
		t.Fatalf("after reopening: %+v %v", rep, err)
	}
}

// BenchmarkAppendDurable appends from several goroutines with fsync on,
// and reports records per second committed to disk.
func BenchmarkAppendDurable(b *testing.B) {
	dir := b.TempDir()
	l := openT(b, dir, nil)
	ev := Event{Type: TypeFlow, SandboxID: "bench", Actor: "daemon", Data: map[string]any{"proto": "tcp", "dst": "93.184.216.34:443", "host": "example.com", "allowed": true}}
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Append(context.Background(), ev)
		}
	})
	flush(b, l)
	el := time.Since(start)
	b.StopTimer()
	// Appenders that outrun the writer for longer than BlockFor drop.
	b.ReportMetric(float64(l.Dropped()), "dropped")
	b.ReportMetric(float64(b.N-int(l.Dropped()))/el.Seconds(), "records/s")
}

// TestOpenNoticesTruncation cuts the log back past a checkpoint while the
// daemon is down: the next Open records it, and Verify reports it even
// after new checkpoints.
func TestOpenNoticesTruncation(t *testing.T) {
	dir := t.TempDir()
	fill(t, dir, 40, func(o *Options) { o.CheckpointEvery = 10 })
	p, lines := segLines(t, dir)
	writeLines(t, p, lines[:20])
	l := openT(t, dir, nil)
	for range 5 {
		l.Append(context.Background(), Event{Type: TypeAPI})
	}
	l.Close()
	recs, _ := l.Query(context.Background(), Filter{Types: []string{TypeTruncated}})
	if len(recs) != 1 || recs[0].Seq != 21 {
		t.Fatalf("truncation records %+v", recs)
	}
	_, err := Verify(dir, l.PublicKey())
	var b *Break
	if !errors.As(err, &b) || b.Seq != 21 || !strings.Contains(b.Reason, "it ended at seq 20, but seq 43 had been signed") {
		t.Fatalf("verify: %v", err)
	}
}

// TestOutputSilentLeavesNoFile: a process that prints nothing costs no
// file (nor its directory, nor an fsync at its end).
func TestOutputSilentLeavesNoFile(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, func(o *Options) { o.NoSync = true })
	o, err := l.Output("quiet", 7, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if s := o.Sum(); s.Path != "" || s.Size != 0 || s.Kept != 0 {
		t.Errorf("silent stream: %+v", s)
	}
	if _, err := os.Stat(filepath.Join(dir, LogDir, outputDir, "quiet")); !os.IsNotExist(err) {
		t.Errorf("a silent process made its sandbox's output directory: %v", err)
	}
}

// TestOutputAfterItsDirectoryWasPruned: a sandbox's later streams find its
// output directory made by its first; one kept after pruning removed that
// directory makes it again.
func TestOutputAfterItsDirectoryWasPruned(t *testing.T) {
	dir := t.TempDir()
	l := openT(t, dir, func(o *Options) { o.NoSync = true })
	keep := func(pid int) OutputSum {
		t.Helper()
		o, err := l.Output("sbx", pid, "stdout")
		if err != nil {
			t.Fatal(err)
		}
		o.Write([]byte("hi\n"))
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
		s := o.Sum()
		if b, err := os.ReadFile(filepath.Join(dir, s.Path)); err != nil || string(b) != "hi\n" {
			t.Fatalf("output of pid %d: %q, %v", pid, b, err)
		}
		return s
	}
	keep(1)
	keep(2)
	if n := l.pruneOutputs(time.Now().Add(time.Hour)); n != 2 {
		t.Fatalf("pruned %d outputs, want 2", n)
	}
	if _, err := os.Stat(filepath.Join(dir, LogDir, outputDir, "sbx")); !os.IsNotExist(err) {
		t.Fatalf("the emptied directory was not removed: %v", err)
	}
	keep(3)
}

// TestOutputSyncedBeforeItsRecord: closing a command's output does not
// wait for the disk (the command's round trip would), yet the record that
// names the output is committed only once the output is synced.
func TestOutputSyncedBeforeItsRecord(t *testing.T) {
	release := make(chan struct{})
	syncing := make(chan string, 4)
	defer func(f func(*os.File) error) { syncFile = f }(syncFile)
	syncFile = func(f *os.File) error {
		syncing <- f.Name()
		<-release
		return f.Sync()
	}
	dir := t.TempDir()
	l := openT(t, dir, nil)
	flush(t, l)
	before := l.Committed()
	o, err := l.Output("sbx", 7, "stdout")
	if err != nil {
		t.Fatal(err)
	}
	o.Write([]byte("hi\n"))
	closed := make(chan error, 1)
	go func() { closed <- o.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case name := <-syncing:
		close(release)
		t.Fatalf("Close waited for the sync of %s", name)
	}
	l.Append(context.Background(), Event{Type: TypeProcEnd, SandboxID: "sbx", Data: map[string]any{"output": o.Sum()}})
	flushed := make(chan error, 1)
	go func() { flushed <- l.Flush(context.Background()) }()
	if name := <-syncing; !strings.HasSuffix(name, filepath.Base(o.Sum().Path)) {
		t.Fatalf("synced %s, want the output %s", name, o.Sum().Path)
	}
	if got := l.Committed(); got != before {
		t.Fatalf("seq %d committed while the output it names was being synced (before: %d)", got, before)
	}
	select {
	case err := <-flushed:
		t.Fatalf("Flush returned (%v) before the output was synced", err)
	default:
	}
	close(release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if l.Committed() <= before {
		t.Fatalf("the process.end record was not committed: seq %d", l.Committed())
	}
	b, err := os.ReadFile(filepath.Join(dir, o.Sum().Path))
	if err != nil || string(b) != "hi\n" {
		t.Fatalf("kept output %q, %v", b, err)
	}
}
