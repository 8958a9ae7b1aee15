package fs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	pb "github.com/fencesandbox/fence/api/envd/filesystem"
)

var (
	errNotDir   = unix.ENOTDIR
	errNotEmpty = unix.ENOTEMPTY
	errIsDir    = unix.EISDIR
)

// Watcher queues are bounded one by one and together: a watcher whose
// client does not keep up overflows, loses its queue and reports the loss
// (an error on its stream or its next poll) instead of growing.
const (
	maxQueuedEvents = 8192  // one watcher
	maxTotalEvents  = 32768 // all watchers of the agent
)

// errWatchOverflow ends a watcher that lost events.
var errWatchOverflow = connect.NewError(connect.CodeDataLoss, errors.New("watch events dropped: the client did not keep up"))

const defaultKeepalive = 90 * time.Second

// watch is one directory watch (fsnotify/inotify) with a bounded queue.
type watch struct {
	root         string
	recursive    bool
	includeEntry bool
	fw           *fsnotify.Watcher
	log          *slog.Logger

	total *atomic.Int64 // events queued by all watchers

	mu       sync.Mutex
	events   []*pb.FilesystemEvent
	overflow bool
	notify   chan struct{}
	done     chan struct{}
	once     sync.Once
}

// network filesystem magics (statfs f_type) refused unless allowed.
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0x517b:     "smb",
	0xff534d42: "cifs",
	0xfe534d42: "smb2",
	0x65735546: "fuse",
}

func newWatch(root string, recursive, includeEntry, allowNetwork bool, total *atomic.Int64, log *slog.Logger) (*watch, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, rpcError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
	}
	if !allowNetwork {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err == nil {
			if name, ok := networkFS[int64(st.Type)]; ok {
				return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s is on a network filesystem (%s); set allowNetworkMounts to watch it", root, name))
			}
		}
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("creating watcher: %w", err))
	}
	w := &watch{
		root: root, recursive: recursive, includeEntry: includeEntry, fw: fw, log: log, total: total,
		notify: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if err := w.add(root); err != nil {
		fw.Close()
		return nil, rpcError(fmt.Errorf("watching %s: %w", root, err))
	}
	go w.run()
	return w, nil
}

// add watches dir and, for recursive watches, every directory below it.
func (w *watch) add(dir string) error {
	if !w.recursive {
		return w.fw.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil
		}
		if d.IsDir() {
			if err := w.fw.Add(p); err != nil && p == dir {
				return err
			}
		}
		return nil
	})
}

// addCreated watches a directory created under a recursive watch, and
// everything below it. What was made in it before its watch was in place
// (`mkdir -p d && touch d/f` usually beats the watcher) sent no event, so
// every entry found below it is reported as created. An entry made between
// the watch and the walk may be reported twice.
func (w *watch) addCreated(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			_ = w.fw.Add(p)
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(w.root, p)
		if err != nil {
			return nil
		}
		fe := &pb.FilesystemEvent{Name: rel, Type: pb.EventType_EVENT_TYPE_CREATE}
		if w.includeEntry {
			if e, err := entryInfo(p, newNames()); err == nil {
				fe.Entry = e
			}
		}
		w.push(fe)
		return nil
	})
}

func (w *watch) run() {
	for {
		select {
		case ev, ok := <-w.fw.Events:
			if !ok {
				return
			}
			w.handle(ev)
		case err, ok := <-w.fw.Errors:
			if !ok {
				return
			}
			w.log.Warn("watch error", "root", w.root, "err", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.markOverflow()
			}
		}
	}
}

var opTypes = []struct {
	op fsnotify.Op
	t  pb.EventType
}{
	{fsnotify.Create, pb.EventType_EVENT_TYPE_CREATE},
	{fsnotify.Write, pb.EventType_EVENT_TYPE_WRITE},
	{fsnotify.Remove, pb.EventType_EVENT_TYPE_REMOVE},
	{fsnotify.Rename, pb.EventType_EVENT_TYPE_RENAME},
	{fsnotify.Chmod, pb.EventType_EVENT_TYPE_CHMOD},
}

func (w *watch) handle(ev fsnotify.Event) {
	rel, err := filepath.Rel(w.root, ev.Name)
	if err != nil || rel == "." || strings.HasPrefix(rel, "../") {
		return
	}
	if w.recursive && ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			// After the directory's own event.
			defer w.addCreated(ev.Name)
		}
	}
	for _, ot := range opTypes {
		if !ev.Has(ot.op) {
			continue
		}
		fe := &pb.FilesystemEvent{Name: rel, Type: ot.t}
		if w.includeEntry && (ot.op == fsnotify.Create || ot.op == fsnotify.Write || ot.op == fsnotify.Chmod) {
			if e, err := entryInfo(ev.Name, newNames()); err == nil {
				fe.Entry = e
			}
		}
		w.push(fe)
	}
}

func (w *watch) push(fe *pb.FilesystemEvent) {
	w.mu.Lock()
	if w.overflow {
		w.mu.Unlock()
		return
	}
	if len(w.events) >= maxQueuedEvents || w.total.Add(1) > maxTotalEvents {
		if len(w.events) < maxQueuedEvents {
			w.total.Add(-1)
		}
		w.mu.Unlock()
		w.markOverflow()
		return
	}
	w.events = append(w.events, fe)
	w.mu.Unlock()
	w.wake()
}

func (w *watch) wake() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// markOverflow discards the queue: the client is told of the loss.
func (w *watch) markOverflow() {
	w.mu.Lock()
	w.total.Add(-int64(len(w.events)))
	w.events, w.overflow = nil, true
	w.mu.Unlock()
	w.wake()
}

// take returns and clears the queued events; overflow reports that events
// were lost.
func (w *watch) take() (evs []*pb.FilesystemEvent, overflow bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs = w.events
	w.events = nil
	w.total.Add(-int64(len(evs)))
	return evs, w.overflow
}

func (w *watch) close() {
	w.once.Do(func() {
		w.mu.Lock()
		w.total.Add(-int64(len(w.events)))
		w.events = nil
		w.mu.Unlock()
		w.fw.Close()
		close(w.done)
	})
}

// WatchDir streams the events of a directory until the client leaves.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	u, err := s.user(req.Header())
	if err != nil {
		return err
	}
	if s.streams.Add(1) > maxWatchers {
		s.streams.Add(-1)
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("too many watch streams (%d)", maxWatchers))
	}
	defer s.streams.Add(-1)
	m := req.Msg
	w, err := runAs(u, func() (*watch, error) {
		return newWatch(s.users.ResolvePath(m.GetPath(), u), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts(), &s.queued, s.log)
	})
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	interval := keepaliveInterval(req.Header())
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		evs, overflow := w.take()
		for _, fe := range evs {
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
				return err
			}
		}
		if overflow {
			return errWatchOverflow
		}
		if len(evs) > 0 {
			t.Reset(interval)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return ctx.Err()
			}
			return nil
		case <-w.notify:
		case <-t.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			t.Reset(interval)
		}
	}
}

func keepaliveInterval(h http.Header) time.Duration {
	if v := h.Get("Keepalive-Ping-Interval"); v != "" {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return defaultKeepalive
}
