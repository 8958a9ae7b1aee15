package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sync"
	"sync/atomic"
	"time"
)

// outputDir holds kept command output: output/<sandbox>/<file>, under the
// log directory.
const outputDir = "output"

var (
	validSandbox = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	validStream  = regexp.MustCompile(`^[a-z]{1,16}$`)
)

var outputSeq atomic.Uint64

// Output keeps one output stream of one process: the first bytes up to the
// per-process and per-sandbox budgets are stored in a file (0600); all of
// it is counted and hashed. Write never fails, so keeping output never
// breaks the stream it copies.
type Output struct {
	l       *Log
	sandbox string
	rel     string // path relative to the data dir
	limit   int64

	sub, name string // where the file goes, made at the first byte kept

	mu     sync.Mutex
	opened bool     // the file was made (or that failed)
	f      *os.File // nil until the first byte kept, and once the budget is spent or a write failed
	h      hash.Hash
	size   int64
	kept   int64
	closed bool
}

// OutputSum describes a closed (or open) output stream.
type OutputSum struct {
	Size   int64  `json:"size"`   // bytes written
	Kept   int64  `json:"kept"`   // bytes stored (the first Kept of Size)
	SHA256 string `json:"sha256"` // of all Size bytes
	Path   string `json:"path"`   // of the stored bytes, relative to the data dir
}

// Output starts keeping a stream ("stdout", "stderr") of process pid of a
// sandbox. The caller writes the stream's bytes to it and closes it when
// the process ends; Sum then goes in the process.end record.
func (l *Log) Output(sandboxID string, pid int, stream string) (*Output, error) {
	if !validSandbox.MatchString(sandboxID) {
		return nil, fmt.Errorf("audit: invalid sandbox ID %q", sandboxID)
	}
	if !validStream.MatchString(stream) {
		return nil, fmt.Errorf("audit: invalid stream name %q", stream)
	}
	// The file is made at the first byte kept: a process that writes
	// nothing (most) costs no file, no directory walk and no fsync.
	sub := path.Join(outputDir, sandboxID)
	name := fmt.Sprintf("%d-%d-%d.%s", l.opts.Now().UnixNano(), pid, outputSeq.Add(1), stream)
	return &Output{l: l, sandbox: sandboxID, sub: sub, name: name, limit: l.opts.OutputPerProcess, h: sha256.New()}, nil
}

// open makes the stream's file; on failure nothing is kept.
//
// +checklocks:o.mu
func (o *Output) open() {
	o.opened = true
	l := o.l
	// The sandbox's directory is made by its first stream kept (or again
	// after pruning emptied it): the others find it there.
	name := path.Join(o.sub, o.name)
	f, err := l.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		if err = l.root.MkdirAll(o.sub, 0o700); err == nil {
			f, err = l.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		}
	}
	if err != nil {
		l.log.Warn("audit: keeping command output", "sandbox", o.sandbox, "err", err)
		return
	}
	l.outMu.Lock()
	if _, ok := l.outUsed[o.sandbox]; !ok {
		l.outUsed[o.sandbox] = dirSize(l.root.FS(), o.sub)
	}
	l.outMu.Unlock()
	o.f, o.rel = f, filepath.Join(LogDir, o.sub, o.name)
}

func dirSize(fsys fs.FS, dir string) int64 {
	var n int64
	ents, _ := fs.ReadDir(fsys, dir)
	for _, e := range ents {
		if i, err := e.Info(); err == nil && i.Mode().IsRegular() {
			n += i.Size()
		}
	}
	return n
}

// Write implements io.Writer; it always reports all of p written.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return len(p), nil
	}
	o.h.Write(p)
	o.size += int64(len(p))
	if !o.opened && len(p) > 0 {
		o.open()
	}
	if o.f == nil {
		return len(p), nil
	}
	keep := min(int64(len(p)), o.limit-o.kept)
	l := o.l
	l.outMu.Lock()
	keep = max(min(keep, l.opts.OutputPerSandbox-l.outUsed[o.sandbox]), 0)
	l.outUsed[o.sandbox] += keep
	l.outMu.Unlock()
	if keep > 0 {
		n, err := o.f.Write(p[:keep])
		o.kept += int64(n)
		if err != nil {
			l.log.Warn("audit: keeping command output", "sandbox", o.sandbox, "err", err)
			keep = 0
		}
	}
	if keep < int64(len(p)) {
		// Budget spent: the rest is only counted and hashed.
		o.f.Close()
		o.f = nil
	}
	return len(p), nil
}

// Close ends the stream. It does not wait for the disk: the stored bytes
// are synced by the log's writer before it commits any record appended
// after Close (the process.end record that names the file, typically), so
// a record on disk never names output that is not. A command's round trip
// therefore does not include an fsync.
func (o *Output) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil
	}
	o.closed = true
	if o.f == nil {
		return nil
	}
	o.l.syncLater(o.f)
	o.f = nil
	return nil
}

// syncFile makes a closed output's bytes durable (a variable for tests).
var syncFile = (*os.File).Sync

// syncLater hands a closed output's file to the writer, which syncs and
// closes it before its next commit. With the writer stopped, the caller
// does it.
func (l *Log) syncLater(f *os.File) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		l.syncFiles([]*os.File{f})
		return
	}
	l.syncMu.Lock()
	l.toSync = append(l.toSync, f)
	l.syncMu.Unlock()
	l.mu.RUnlock()
	select {
	case l.syncKick <- struct{}{}:
	default:
	}
}

// syncOutputs syncs and closes the outputs closed so far.
func (l *Log) syncOutputs() {
	l.syncMu.Lock()
	fs := l.toSync
	l.toSync = nil
	l.syncMu.Unlock()
	l.syncFiles(fs)
}

// maxParallelSyncs bounds the fsyncs of outputs that run at once.
const maxParallelSyncs = 8

func (l *Log) syncFiles(files []*os.File) {
	one := func(f *os.File) {
		var err error
		if !l.opts.NoSync {
			err = syncFile(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			l.log.Warn("audit: keeping command output", "file", f.Name(), "err", err)
		}
	}
	if len(files) == 1 {
		one(files[0])
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelSyncs)
	for _, f := range files {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			one(f)
		})
	}
	wg.Wait()
}

// Sum is the stream's size, kept size, SHA-256 (of everything written so
// far) and the stored file ("" when nothing was written).
func (o *Output) Sum() OutputSum {
	o.mu.Lock()
	defer o.mu.Unlock()
	return OutputSum{Size: o.size, Kept: o.kept, SHA256: hex.EncodeToString(o.h.Sum(nil)), Path: o.rel}
}

// pruneOutputs removes output files older than cutoff, and the sandbox
// directories they leave empty. It returns how many files it removed.
func (l *Log) pruneOutputs(cutoff time.Time) int {
	n := 0
	ents, err := fs.ReadDir(l.root.FS(), outputDir)
	if err != nil {
		return 0
	}
	for _, sb := range ents {
		if !sb.IsDir() {
			continue
		}
		sub := path.Join(outputDir, sb.Name())
		files, _ := fs.ReadDir(l.root.FS(), sub)
		left := len(files)
		for _, f := range files {
			i, err := f.Info()
			if err != nil || !i.ModTime().Before(cutoff) {
				continue
			}
			if err := l.root.Remove(path.Join(sub, f.Name())); err == nil || errors.Is(err, os.ErrNotExist) {
				n++
				left--
			}
		}
		l.outMu.Lock()
		delete(l.outUsed, sb.Name()) // counted again from the files on next use
		l.outMu.Unlock()
		if left == 0 {
			l.root.Remove(sub)
		}
	}
	return n
}
