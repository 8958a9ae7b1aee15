package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/syslog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A Forwarder sends every committed record, as its exact line, to a
// destination off the log: a file, a syslog server or an HTTPS endpoint.
// It reads from the segments, not from the writer, so it never slows the
// writer; a destination that is down or slow only makes it lag, and it
// catches up from the files (at least once: after a failure or a restart
// some lines may be sent twice; their seq tells them apart). Where it got
// to is kept in the log directory, so a restarted daemon goes on from
// there.
type Forwarder struct {
	l      *Log
	dest   string
	sink   forwardSink
	state  string // file holding the last seq sent
	cancel context.CancelFunc
	done   chan struct{}

	sent     atomic.Uint64
	failures atomic.Uint64
	last     atomic.Uint64
}

type forwardSink interface {
	send(ctx context.Context, lines [][]byte) error
	close() error
}

// forwardBatch bounds the lines sent at once.
const forwardBatch = 1000

// Forward starts forwarding to dest: file:PATH (lines appended, fsynced),
// syslog:HOST:PORT (UDP) or syslog+tcp:HOST:PORT (one message per record),
// or https://URL (POST of a batch of lines, application/x-ndjson; http://
// only to a loopback address). It starts after the last record it sent
// before (for this dest), or with the records committed from now on. A
// file copy is exact across crashes (its last line is the position); the
// other destinations may get the records of the last second again after
// a crash (the position is saved once a second), never miss one.
func (l *Log) Forward(dest string) (*Forwarder, error) {
	sink, err := newForwardSink(dest)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256([]byte(dest))
	f := &Forwarder{l: l, dest: dest, sink: sink, done: make(chan struct{}),
		state: filepath.Join(l.dir, "forward-"+hex.EncodeToString(h[:6]))}
	switch b, err := os.ReadFile(f.state); {
	case err == nil:
		n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		f.last.Store(n)
	default:
		// A new destination starts with the records committed from now on,
		// and that start is kept at once: a crash before the first
		// periodic save must not move it past records not yet sent.
		f.last.Store(l.Committed())
		f.saveState()
	}
	// A file holds its own position: its last line is the last record
	// sent, whatever the saved position says (saved at most once a
	// second, so a crash may leave it behind what was sent).
	if fs, ok := sink.(*fileSink); ok && fs.lastSeq > 0 {
		f.last.Store(fs.lastSeq)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go f.run(ctx)
	return f, nil
}

// Stats returns the records sent, the failed attempts and the last seq
// sent.
func (f *Forwarder) Stats() (sent, failures, last uint64) {
	return f.sent.Load(), f.failures.Load(), f.last.Load()
}

// Wait waits until every record committed so far is sent, or ctx is done.
func (f *Forwarder) Wait(ctx context.Context) error {
	want := f.l.Committed()
	for f.last.Load() < want {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// Close stops forwarding (what is committed but not yet sent is sent by
// the next Forward to the same dest).
func (f *Forwarder) Close() error {
	f.cancel()
	<-f.done
	f.saveState()
	return f.sink.close()
}

func (f *Forwarder) saveState() {
	if err := writeFileAtomic(f.state, []byte(strconv.FormatUint(f.last.Load(), 10)+"\n"), 0o600); err != nil {
		f.l.log.Warn("audit: saving the forwarder's position", "dest", f.dest, "err", err)
	}
}

func (f *Forwarder) run(ctx context.Context) {
	defer close(f.done)
	backoff := time.Second
	var lastSave time.Time
	for {
		wake := f.l.changed()
		var lines [][]byte
		var lastSeq uint64
		upTo := f.l.Committed()
		var err error
		if upTo > f.last.Load() {
			err = scan(ctx, f.l.dir, &f.l.idx, Filter{After: f.last.Load()}, upTo, func(r *Record, l []byte) error {
				lines = append(lines, bytes.Clone(l))
				lastSeq = r.Seq
				if len(lines) == forwardBatch {
					return errStop
				}
				return nil
			})
		}
		if err != nil && !errors.Is(err, errStop) {
			if ctx.Err() != nil {
				return
			}
			f.l.log.Warn("audit: reading records to forward", "err", err)
		}
		if len(lines) > 0 {
			if err := f.sink.send(ctx, lines); err != nil {
				if ctx.Err() != nil {
					return
				}
				f.failures.Add(1)
				f.l.log.Warn("audit: forwarding records", "dest", f.dest, "err", err, "retry_in", backoff)
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 30*time.Second)
				continue
			}
			backoff = time.Second
			f.sent.Add(uint64(len(lines)))
			f.last.Store(lastSeq)
			if time.Since(lastSave) >= time.Second {
				f.saveState()
				lastSave = time.Now()
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-time.After(5 * time.Second):
		}
	}
}

// changed returns a channel closed at the next commit.
func (l *Log) changed() <-chan struct{} {
	l.subMu.Lock()
	defer l.subMu.Unlock()
	if l.commitCh == nil {
		l.commitCh = make(chan struct{})
	}
	return l.commitCh
}

func newForwardSink(dest string) (forwardSink, error) {
	switch {
	case strings.HasPrefix(dest, "file:"):
		p := strings.TrimPrefix(dest, "file:")
		if p == "" {
			return nil, errors.New("audit forward: file: needs a path")
		}
		fd, err := os.OpenFile(p, os.O_RDWR|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("audit forward: %w", err)
		}
		last, err := lastSeqOf(fd)
		if err != nil {
			fd.Close()
			return nil, fmt.Errorf("audit forward: reading %s: %w", p, err)
		}
		return &fileSink{f: fd, lastSeq: last}, nil
	case strings.HasPrefix(dest, "syslog:"), strings.HasPrefix(dest, "syslog+tcp:"):
		network, addr := "udp", strings.TrimPrefix(dest, "syslog:")
		if strings.HasPrefix(dest, "syslog+tcp:") {
			network, addr = "tcp", strings.TrimPrefix(dest, "syslog+tcp:")
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("audit forward: syslog needs HOST:PORT: %w", err)
		}
		return &syslogSink{network: network, addr: addr}, nil
	case strings.HasPrefix(dest, "https://"), strings.HasPrefix(dest, "http://"):
		u, err := url.Parse(dest)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("audit forward: bad URL %q", dest)
		}
		if u.Scheme == "http" {
			ip := net.ParseIP(u.Hostname())
			if u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
				return nil, errors.New("audit forward: http:// only to a loopback address; use https://")
			}
		}
		return &httpSink{url: dest, client: &http.Client{Timeout: 30 * time.Second}}, nil
	}
	return nil, fmt.Errorf("audit forward: %q is not file:PATH, syslog:HOST:PORT, syslog+tcp:HOST:PORT or https://URL", dest)
}

type fileSink struct {
	f *os.File
	// lastSeq is the seq of the file's last complete line when opened
	// (0 for an empty file or one whose last line is not a record).
	lastSeq uint64
}

// lastSeqOf reads the seq of the last complete line of f (a forwarded
// copy). A line cut short by a crash is not counted: the record is sent
// again after it (the copy then holds one broken line, which its
// verification reports).
func lastSeqOf(f *os.File) (uint64, error) {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return 0, err
	}
	const tail = 256 << 10 // well above one record
	off := max(st.Size()-tail, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	end := bytes.LastIndexByte(buf, '\n')
	if end < 0 {
		return 0, nil
	}
	line := buf[:end]
	if i := bytes.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	var r struct {
		Seq uint64 `json:"seq"`
	}
	if json.Unmarshal(line, &r) != nil {
		return 0, nil
	}
	return r.Seq, nil
}

func (s *fileSink) send(_ context.Context, lines [][]byte) error {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	if _, err := s.f.Write(b.Bytes()); err != nil {
		return err
	}
	return s.f.Sync()
}

func (s *fileSink) close() error { return s.f.Close() }

type syslogSink struct {
	network, addr string
	w             *syslog.Writer
}

func (s *syslogSink) send(_ context.Context, lines [][]byte) error {
	if s.w == nil {
		w, err := syslog.Dial(s.network, s.addr, syslog.LOG_INFO|syslog.LOG_AUTHPRIV, "fence-audit")
		if err != nil {
			return err
		}
		s.w = w
	}
	for _, l := range lines {
		if err := s.w.Info(string(l)); err != nil {
			s.w.Close()
			s.w = nil
			return err
		}
	}
	return nil
}

func (s *syslogSink) close() error {
	if s.w != nil {
		return s.w.Close()
	}
	return nil
}

type httpSink struct {
	url    string
	client *http.Client
}

func (s *httpSink) send(ctx context.Context, lines [][]byte) error {
	var b bytes.Buffer
	for _, l := range lines {
		b.Write(l)
		b.WriteByte('\n')
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, &b)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", s.url, resp.Status)
	}
	return nil
}

func (s *httpSink) close() error {
	s.client.CloseIdleConnections()
	return nil
}
