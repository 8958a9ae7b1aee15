package audit

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Log. Zero fields take the defaults noted.
type Options struct {
	// Dir is the daemon's data dir: segments go to Dir/audit, the key to
	// Dir/audit-key and the public key to Dir/audit.pub. Required.
	Dir    string
	Logger *slog.Logger // nil discards
	// SegmentSize is the size past which a new segment is started; 64 MiB.
	SegmentSize int64
	// QueueSize bounds the events waiting for the writer; 65536.
	QueueSize int
	// QueueBytes bounds the bytes of the records waiting for the writer
	// and being written; 32 MiB. Sandbox-driven records (SandboxDriven)
	// may take three quarters of it and of QueueSize, never more, so that
	// the rest is always there for the control plane and commands.
	QueueBytes int64
	// SandboxRate and SandboxBurst are each sandbox's allowance of
	// sandbox-driven records: a token bucket of SandboxBurst (1000)
	// refilled at SandboxRate a second (100), one for refusals (a
	// "decision" of "deny") and one for the rest. Records over it, and those
	// that find the sandboxes' share of the queue full, are not queued:
	// they are counted per type, host, decision and secret, and an
	// audit.suppressed record of the counts goes in the chain once the
	// first of them is SummaryEvery (10 s) old, or at Close.
	SandboxRate  float64
	SandboxBurst int
	SummaryEvery time.Duration
	// MaxBytes caps the segments on disk: past it the oldest sealed
	// segments are removed (after each new segment, at Open and hourly),
	// each after a prune record and a checkpoint that signs it. 0: no cap.
	// A segment is at most a quarter of MaxBytes.
	MaxBytes int64
	// MaxBatch bounds the records committed by one write and fsync; 8192.
	MaxBatch int
	// BlockFor is how long Append waits for room in a full queue before it
	// drops the event (counted, and recorded as an audit.dropped record);
	// 100 ms.
	BlockFor time.Duration
	// CheckpointEvery and CheckpointInterval: a signed checkpoint follows
	// every CheckpointEvery records (1000) and, when records were written
	// since the last one, every CheckpointInterval (5 s).
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// Retention: segments and command outputs older than this are removed
	// (at Open and hourly); 7 days. Negative keeps everything.
	Retention time.Duration
	// OutputPerProcess and OutputPerSandbox bound the command output kept
	// (per stream, and over all streams of a sandbox); 1 MiB and 16 MiB.
	// Output beyond them is counted and hashed, not kept.
	OutputPerProcess int64
	OutputPerSandbox int64
	// NoSync skips fsync (tests of everything but durability).
	NoSync bool
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.SegmentSize <= 0 {
		o.SegmentSize = 64 << 20
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 1 << 16
	}
	if o.QueueBytes <= 0 {
		o.QueueBytes = 32 << 20
	}
	if o.SandboxRate <= 0 {
		o.SandboxRate = 100
	}
	if o.SandboxBurst <= 0 {
		o.SandboxBurst = 1000
	}
	if o.SummaryEvery <= 0 {
		o.SummaryEvery = 10 * time.Second
	}
	if o.MaxBytes > 0 && o.SegmentSize > o.MaxBytes/4 {
		o.SegmentSize = max(o.MaxBytes/4, 1)
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 8192
	}
	if o.BlockFor <= 0 {
		o.BlockFor = 100 * time.Millisecond
	}
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = 1000
	}
	if o.CheckpointInterval <= 0 {
		o.CheckpointInterval = 5 * time.Second
	}
	if o.Retention == 0 {
		o.Retention = 7 * 24 * time.Hour
	}
	if o.OutputPerProcess <= 0 {
		o.OutputPerProcess = 1 << 20
	}
	if o.OutputPerSandbox <= 0 {
		o.OutputPerSandbox = 16 << 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Log is the audit log. It implements Sink. See the package doc and
// docs/AUDIT.md for the format and guarantees:
//
//   - Append queues and returns: it waits at most Options.BlockFor for room
//     in a full queue, then drops the event; drops are counted (Dropped)
//     and recorded in the chain as an audit.dropped record.
//   - One writer goroutine commits in batches (group commit): it writes a
//     batch with one write, fsyncs, then publishes it (Query, Subscribe).
//     A crash loses at most what was queued and the batch being written
//     (QueueSize + MaxBatch records; in practice the last few
//     milliseconds). Flush waits until everything appended before it is
//     on disk.
//   - Kept command output (Output) is synced by the same writer, before
//     the first commit after its Close: a record on disk never names
//     output that is not, and no caller waits for that sync.
//   - Records are hash-chained (prev) and checkpoints sign the chain with
//     the key in DATA-DIR/audit-key.
type Log struct {
	opts    Options
	dir     string // DATA-DIR/audit
	dataDir string
	key     ed25519.PrivateKey
	pub     ed25519.PublicKey
	log     *slog.Logger

	mu     sync.RWMutex // held for reading by Append while it queues
	closed bool
	ch     chan pending

	dropped atomic.Int64 // since the last audit.dropped record
	// queued is the bytes of the records queued and being written;
	// waiters counts the appenders waiting for some of it to go, and
	// room is closed (and replaced) when it does.
	queued    atomic.Int64
	waiters   atomic.Int32
	roomMu    sync.Mutex
	room      chan struct{}
	allow     allowances
	suppTot   atomic.Int64
	pruneDue  bool // a segment was sealed: the writer checks MaxBytes
	signNext  bool // the next commit ends with a checkpoint
	dropTotal atomic.Int64
	writeErrs atomic.Int64

	stop chan struct{}
	done chan struct{}

	// Writer state (the writer goroutine's alone once started).
	f         *os.File
	segFirst  uint64
	segSize   int64
	seq       uint64
	prev      string
	sinceCk   int
	lastCk    time.Time
	lastHead  time.Time
	headDirty bool
	lastCkRec string // the checkpoint data of the last checkpoint
	buf       []byte
	lastPrune time.Time

	committed atomic.Uint64 // the last seq on disk

	subMu    sync.Mutex
	subs     map[*Subscription]struct{}
	commitCh chan struct{} // closed at the next commit (Forwarder)

	root    *os.Root // the log directory, for outputs
	outMu   sync.Mutex
	outUsed map[string]int64 // bytes kept per sandbox

	syncMu   sync.Mutex
	toSync   []*os.File    // closed outputs the writer syncs before its next commit
	syncKick chan struct{} // wakes the writer for toSync

	idx segIndex
}

type pending struct {
	time                time.Time
	typ, sandbox, actor string
	data                json.RawMessage
	body                []byte
	size                int64         // bytes counted in Log.queued
	flush               chan struct{} // a Flush marker, no record
}

// Open opens (creating if needed) the audit log of a data dir, recovers
// from a crash (a torn final line is cut, and that is recorded) and starts
// the writer. Close it to stop the writer and sign the tail.
func Open(opts Options) (*Log, error) {
	opts.defaults()
	if opts.Dir == "" {
		return nil, errors.New("audit: Options.Dir is required")
	}
	l := &Log{
		opts:     opts,
		dataDir:  opts.Dir,
		dir:      filepath.Join(opts.Dir, LogDir),
		log:      opts.Logger,
		ch:       make(chan pending, opts.QueueSize),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		subs:     map[*Subscription]struct{}{},
		outUsed:  map[string]int64{},
		syncKick: make(chan struct{}, 1),
		room:     make(chan struct{}),
		allow: allowances{rate: opts.SandboxRate, burst: float64(opts.SandboxBurst), window: opts.SummaryEvery,
			m: map[string]*allowance{}},
	}
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: creating %s: %w", l.dir, err)
	}
	if err := os.Chmod(l.dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	root, err := os.OpenRoot(l.dir)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l.root = root
	ok := false
	defer func() {
		if !ok {
			root.Close()
			if l.f != nil {
				l.f.Close()
			}
		}
	}()
	key, err := loadOrCreateKey(filepath.Join(opts.Dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l.key = key
	l.pub = key.Public().(ed25519.PublicKey)
	if err := writePub(filepath.Join(opts.Dir, PubFile), l.pub); err != nil {
		return nil, fmt.Errorf("audit: writing public key: %w", err)
	}
	notes, err := l.recover()
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l.committed.Store(l.seq)
	l.lastCk = opts.Now()
	for _, n := range notes {
		l.writeInternal(n)
	}
	l.prune()
	ok = true
	go l.run()
	return l, nil
}

// PublicKey is the key checkpoints are signed with.
func (l *Log) PublicKey() ed25519.PublicKey { return l.pub }

// Dropped is how many events Append dropped since Open.
func (l *Log) Dropped() int64 { return l.dropTotal.Load() }

// Committed is the seq of the last record on disk.
func (l *Log) Committed() uint64 { return l.committed.Load() }

// Append queues an event; see Log for when it drops one. A
// sandbox-driven event (SandboxDriven, with a SandboxID) never waits: over
// the sandbox's allowance, or with the sandboxes' share of the queue full,
// it is counted in the sandbox's next audit.suppressed record instead.
func (l *Log) Append(ctx context.Context, ev Event) {
	now := l.opts.Now()
	if ev.Time.IsZero() {
		ev.Time = now
	}
	if ev.Type == "" {
		ev.Type = "unknown"
	}
	driven := ev.SandboxID != "" && SandboxDriven(ev.Type)
	if driven && !l.allow.take(ev.SandboxID, bucket(&ev), now) {
		l.suppress(&ev, now)
		return
	}
	p := newPending(ev, driven)
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		l.drop()
		return
	}
	if driven {
		l.offer(&ev, p, now)
		return
	}
	l.queue(ctx, p)
}

// newPending lays out ev's record but for its seq and prev, with the
// fields of a sandbox-driven event capped.
func newPending(ev Event, driven bool) pending {
	data := marshalData(capFields(ev.Data, driven))
	p := pending{time: ev.Time, typ: ev.Type, sandbox: ev.SandboxID, actor: ev.Actor, data: data}
	p.body = body(p.time, p.typ, p.sandbox, p.actor, p.data)
	p.size = int64(len(p.body)) + 100 // seq, prev and the rest of the line
	return p
}

// offer queues a sandbox-driven event's record p without waiting, within
// the sandboxes' share (three quarters) of the queue, and counts ev as
// suppressed when there is no room. The caller holds l.mu for reading.
func (l *Log) offer(ev *Event, p pending, now time.Time) {
	if len(l.ch) >= max(1, l.opts.QueueSize*3/4) || !l.reserve(p.size, max(1, l.opts.QueueBytes*3/4)) {
		l.suppress(ev, now)
		return
	}
	select {
	case l.ch <- p:
	default:
		l.release(p.size)
		l.suppress(ev, now)
	}
}

// queue queues record p, waiting up to BlockFor (or until ctx is done)
// for room in the queue's bytes and then in the channel, and drops it
// after that. The caller holds l.mu for reading.
func (l *Log) queue(ctx context.Context, p pending) {
	var t *time.Timer
	wait := func(c <-chan struct{}) bool {
		if t == nil {
			t = time.NewTimer(l.opts.BlockFor)
		}
		select {
		case <-c:
			return true // +checklocksignore: a closure made under l.mu.RLock, released by Append
		case <-t.C:
		case <-ctx.Done():
		}
		l.drop()
		return false // +checklocksignore: a closure made under l.mu.RLock, released by Append
	}
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for !l.reserve(p.size, l.opts.QueueBytes) {
		l.waiters.Add(1)
		l.roomMu.Lock()
		room := l.room
		l.roomMu.Unlock()
		// Room made after this reserve closes the channel taken.
		if l.reserve(p.size, l.opts.QueueBytes) {
			l.waiters.Add(-1)
			break
		}
		ok := wait(room)
		l.waiters.Add(-1)
		if !ok {
			return
		}
	}
	select {
	case l.ch <- p:
		return
	default:
	}
	if t == nil {
		t = time.NewTimer(l.opts.BlockFor)
	}
	select {
	case l.ch <- p:
	case <-t.C:
		l.release(p.size)
		l.drop()
	case <-ctx.Done():
		l.release(p.size)
		l.drop()
	}
}

// suppress counts a sandbox-driven event that is not queued.
func (l *Log) suppress(ev *Event, now time.Time) {
	l.suppTot.Add(1)
	l.allow.suppress(ev, now)
}

// Suppressed is how many sandbox-driven events were kept out of the log
// (and counted in audit.suppressed records) since Open.
func (l *Log) Suppressed() int64 { return l.suppTot.Load() }

// reserve counts n more bytes queued if that stays within limit (or the
// queue is empty: one record always fits).
func (l *Log) reserve(n, limit int64) bool {
	for {
		cur := l.queued.Load()
		if cur > 0 && cur+n > limit {
			return false
		}
		if l.queued.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// release uncounts n bytes and wakes the appenders waiting for room.
func (l *Log) release(n int64) {
	if n == 0 {
		return
	}
	l.queued.Add(-n)
	if l.waiters.Load() > 0 {
		l.roomMu.Lock()
		close(l.room)
		l.room = make(chan struct{})
		l.roomMu.Unlock()
	}
}

func (l *Log) drop() {
	l.dropped.Add(1)
	l.dropTotal.Add(1)
}

// Flush waits until every event appended before it is on disk (or ctx is
// done, or the log closed).
func (l *Log) Flush(ctx context.Context) error {
	done := make(chan struct{})
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return errors.New("audit: log closed")
	}
	select {
	case l.ch <- pending{flush: done}:
	case <-ctx.Done():
		l.mu.RUnlock()
		return ctx.Err()
	}
	l.mu.RUnlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close commits what is queued, signs the tail with a checkpoint and
// stops the writer. Appends after Close are dropped.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	l.subMu.Lock()
	for s := range l.subs {
		s.end(errors.New("audit log closed"))
	}
	l.subs = map[*Subscription]struct{}{}
	l.subMu.Unlock()
	return l.root.Close()
}

// run is the writer.
func (l *Log) run() {
	defer close(l.done)
	defer func() {
		if l.f != nil {
			l.f.Close()
		}
	}()
	tick := time.NewTicker(min(l.opts.CheckpointInterval, time.Second))
	defer tick.Stop()
	batch := make([]pending, 0, 64)
	for {
		select {
		case p := <-l.ch:
			batch = append(batch[:0], p)
			batch = l.fill(batch)
			l.commit(batch)
			if l.pruneDue {
				l.prune()
			}
		case <-l.syncKick:
			l.syncOutputs()
		case <-tick.C:
			l.periodic()
		case <-l.stop:
			for {
				batch = l.fill(batch[:0])
				if len(batch) == 0 {
					break
				}
				l.commit(batch)
				if l.pruneDue {
					l.prune()
				}
			}
			if ps := l.allow.due(l.opts.Now(), true); len(ps) > 0 {
				l.commit(ps)
			}
			if l.sinceCk > 0 {
				l.commit(nil) // a checkpoint over the tail
			}
			l.syncOutputs()
			l.writeHead()
			return
		}
	}
}

// fill adds queued events to batch, up to MaxBatch, without waiting.
func (l *Log) fill(batch []pending) []pending {
	for len(batch) < l.opts.MaxBatch {
		select {
		case p := <-l.ch:
			batch = append(batch, p)
		default:
			return batch
		}
	}
	return batch
}

func (l *Log) periodic() {
	now := l.opts.Now()
	if ps := l.allow.due(now, false); len(ps) > 0 {
		l.commit(ps)
	}
	if l.sinceCk > 0 && now.Sub(l.lastCk) >= l.opts.CheckpointInterval {
		l.commit(nil)
	}
	if l.headDirty && now.Sub(l.lastHead) >= time.Second {
		l.writeHead()
	}
	if now.Sub(l.lastPrune) >= time.Hour {
		l.prune()
	}
}

// commit writes batch (and any record of drops, and a checkpoint when
// due), fsyncs, then publishes. With a nil batch it writes a checkpoint
// over the tail.
func (l *Log) commit(batch []pending) {
	// Output closed before any of batch was appended reaches the disk
	// before the records that name it.
	l.syncOutputs()
	l.buf = l.buf[:0]
	startSeq := l.seq
	var recs []Record
	var ends []int
	var flushes []chan struct{}
	add := func(p pending) {
		if p.body == nil {
			p.body = body(p.time, p.typ, p.sandbox, p.actor, p.data)
		}
		l.seq++
		prev := l.prev
		start := len(l.buf)
		l.buf = line(l.buf, l.seq, p.body, prev)
		l.prev = hexHash(l.buf[start:])
		l.buf = append(l.buf, '\n')
		ends = append(ends, len(l.buf))
		recs = append(recs, Record{Seq: l.seq, Time: p.time, Type: p.typ, Sandbox: p.sandbox, Actor: p.actor, Data: p.data, Prev: prev})
		if p.typ == TypeCheckpoint {
			l.sinceCk = 0
		} else {
			l.sinceCk++
		}
	}
	for _, p := range batch {
		if p.flush != nil {
			flushes = append(flushes, p.flush)
			continue
		}
		add(p)
		if l.sinceCk >= l.opts.CheckpointEvery {
			add(l.checkpoint())
		}
	}
	if n := l.dropped.Swap(0); n > 0 {
		add(pending{time: l.opts.Now(), typ: TypeDropped, data: mustJSON(map[string]any{"count": n})})
	}
	if (batch == nil || l.signNext) && l.sinceCk > 0 {
		add(l.checkpoint())
	}
	l.signNext = false
	if len(recs) > 0 {
		n, err := l.write(l.buf, ends, startSeq+1)
		if err != nil {
			l.log.Error("audit: writing records", "err", err, "records", len(recs), "written", n)
			l.writeErrs.Add(1)
		}
		if n < len(recs) {
			// The records not written are lost: the chain goes on from
			// the last one in the files, and the loss is counted as drops.
			l.seq, l.prev = recs[n].Seq-1, recs[n].Prev
			lost := int64(len(recs) - n)
			l.dropped.Add(lost)
			l.dropTotal.Add(lost)
			recs = recs[:n]
		}
	}
	for i := len(recs) - 1; i >= 0; i-- {
		// The head names only a checkpoint that is on disk.
		if recs[i].Type == TypeCheckpoint {
			l.lastCkRec, l.headDirty = string(recs[i].Data), true
			break
		}
	}
	if len(recs) > 0 {
		l.committed.Store(l.seq)
		l.publish(recs)
	}
	var size int64
	for _, p := range batch {
		size += p.size
	}
	l.release(size)
	for _, c := range flushes {
		close(c)
	}
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// checkpoint builds the checkpoint over the record last added.
func (l *Log) checkpoint() pending {
	h, _ := hex.DecodeString(l.prev)
	sig := ed25519.Sign(l.key, checkpointMessage(l.seq, h))
	data := map[string]any{"seq": l.seq, "hash": l.prev, "sig": base64.StdEncoding.EncodeToString(sig), "key": keyID(l.pub)}
	l.lastCk = l.opts.Now()
	return pending{time: l.lastCk, typ: TypeCheckpoint, data: mustJSON(data)}
}

// writeInternal commits one of the log's own records at once (before the
// writer starts, or from it).
func (l *Log) writeInternal(p pending) {
	l.commit([]pending{p})
}
