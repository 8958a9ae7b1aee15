package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func waitForwarded(t *testing.T, f *Forwarder, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, last := f.Stats(); last >= seq {
			return
		}
		if time.Now().After(deadline) {
			sent, fail, last := f.Stats()
			t.Fatalf("forwarded up to %d (sent %d, %d failures), want %d", last, sent, fail, seq)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestForwardFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(t.TempDir(), "copy")
	l := openT(t, dir, func(o *Options) { o.NoSync = true; o.CheckpointEvery = 100 })
	f, err := l.Forward("file:" + out)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1500 {
		l.Append(context.Background(), Event{Type: TypeAPI, Data: map[string]any{"i": i}})
	}
	flush(t, l)
	waitForwarded(t, f, l.Committed())
	f.Close()
	// Records committed while no forwarder runs are sent by the next one.
	for range 10 {
		l.Append(context.Background(), Event{Type: TypeAPI})
	}
	l.Close()
	l2 := openT(t, dir, func(o *Options) { o.NoSync = true })
	f2, err := l2.Forward("file:" + out)
	if err != nil {
		t.Fatal(err)
	}
	waitForwarded(t, f2, l2.Committed())
	f2.Close()
	// The copy is the log, line for line: it verifies on its own.
	vdir := t.TempDir()
	os.MkdirAll(filepath.Join(vdir, LogDir), 0o700)
	b, _ := os.ReadFile(out)
	os.WriteFile(filepath.Join(vdir, LogDir, segName(1)), b, 0o600)
	rep, err := Verify(vdir, l.PublicKey())
	if err != nil || rep.LastSeq != l2.Committed() {
		t.Fatalf("the forwarded copy: %+v %v", rep, err)
	}
}

func TestForwardHTTPRetries(t *testing.T) {
	var mu sync.Mutex
	var got bytes.Buffer
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got.Write(b)
		mu.Unlock()
	}))
	defer srv.Close()
	l := openT(t, t.TempDir(), func(o *Options) { o.NoSync = true })
	f, err := l.Forward(srv.URL + "/ingest")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 20 {
		l.Append(context.Background(), Event{Type: TypeAPI})
	}
	flush(t, l)
	waitForwarded(t, f, l.Committed())
	if _, fails, _ := f.Stats(); fails != 2 {
		t.Fatalf("%d failures", fails)
	}
	mu.Lock()
	defer mu.Unlock()
	lines := strings.Split(strings.TrimSpace(got.String()), "\n")
	if uint64(len(lines)) != l.Committed() || !strings.HasPrefix(lines[0], `{"seq":1,`) {
		t.Fatalf("received %d lines: %q", len(lines), lines[0])
	}
	if _, err := l.Forward("http://example.com/x"); err == nil {
		t.Fatal("plain http off the host accepted")
	}
	if _, err := l.Forward("ftp://x"); err == nil {
		t.Fatal("an unknown destination accepted")
	}
}

func TestForwardSyslog(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	l := openT(t, t.TempDir(), func(o *Options) { o.NoSync = true })
	f, err := l.Forward("syslog:" + pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l.Append(context.Background(), Event{Type: TypeKill, SandboxID: "sbx"})
	pc.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 64<<10)
	n, _, err := pc.ReadFrom(buf)
	if err != nil {
		t.Fatal(err)
	}
	msg := string(buf[:n])
	if !strings.Contains(msg, "fence-audit") || !strings.Contains(msg, `{"seq":1,`) || !strings.Contains(msg, `"sandbox":"sbx"`) {
		t.Fatalf("syslog message %q", msg)
	}
}

// TestForwardFileAfterCrash: a daemon killed between sending records to a
// file and saving its position (or before its first save) neither skips
// nor repeats records: the file's last line is the position.
func TestForwardFileAfterCrash(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(t.TempDir(), "copy")
	l := openT(t, dir, func(o *Options) { o.NoSync = true; o.CheckpointEvery = 100 })
	f, err := l.Forward("file:" + out)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		l.Append(context.Background(), Event{Type: TypeAPI})
	}
	flush(t, l)
	waitForwarded(t, f, l.Committed())
	f.cancel() // a crash: the forwarder stops without saving its position
	<-f.done
	f.sink.close()
	// Records committed after the forwarder's end, and a saved position
	// behind what the file holds (the periodic save lagged) or none.
	for range 3 {
		l.Append(context.Background(), Event{Type: TypeAPI})
	}
	flush(t, l)
	for _, state := range []string{"1\n", ""} {
		if state == "" {
			os.Remove(f.state)
		} else if err := os.WriteFile(f.state, []byte(state), 0o600); err != nil {
			t.Fatal(err)
		}
		f2, err := l.Forward("file:" + out)
		if err != nil {
			t.Fatal(err)
		}
		waitForwarded(t, f2, l.Committed())
		f2.Close()
	}
	l.Close()
	b, _ := os.ReadFile(out)
	var seqs []uint64
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("bad line %q: %v", line, err)
		}
		seqs = append(seqs, r.Seq)
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("forwarded seqs %v: want 1..%d, each once", seqs, len(seqs))
		}
	}
	if uint64(len(seqs)) < 8 {
		t.Fatalf("forwarded seqs %v: records lost", seqs)
	}
}
