package native

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Changes recorded as they happen (the copy store with a disk per
// sandbox).
//
// A sandbox's writable layer is the upper directory of a filesystem of its
// own (an ext4 image, internal/quota), so a fanotify mark on that
// filesystem sees the changes of that sandbox alone. From its first
// checkpoint on, a changeWatch records, by directory inode, the names of
// the entries created, deleted, moved, written, truncated or whose
// attributes (mode, owner, times, extended attributes) changed, and the
// directories whose own attributes changed. The next checkpoint, while
// the sandbox is frozen, drains the queue and examines only those names
// (watchdelta.go) instead of every entry of the layer.
//
// Writes through a shared mapping make no event: the checkpoint also
// examines every file a process of the sandbox maps shared or holds open
// for writing (heldInodes); a write through a descriptor closed since
// makes a close-write event at its last close. An event names one name of
// a file with several links: the checkpoint examines the others too. The record is lost, and the next checkpoint
// walks the whole layer as before, when the kernel's queue overflows
// (bounded: no FAN_UNLIMITED_QUEUE), when the record outgrows
// maxWatchChanges, when an event names its directory in a form the
// record cannot place, when a checkpoint that took the record fails, or
// when there is no watcher (the sandbox's first checkpoint, a daemon that
// restarted, the kernel refusing another fanotify group). A lost record's
// group is closed at once, its mark going with it: the sandbox's writes
// make no more events and the daemon reads none until the next
// checkpoint, which walks and starts a new watcher while the sandbox is
// still frozen.
//
// The watcher never opens anything by a name the sandbox chose: a name is
// only a key, examined later through descriptors inside the writable
// layer (each element opened with O_NOFOLLOW from the layer's root), and
// it costs the daemon at most one wake-up every watchPace (watchPoller).

const (
	watchMask = unix.FAN_CREATE | unix.FAN_DELETE | unix.FAN_MOVED_FROM | unix.FAN_MOVED_TO |
		unix.FAN_ATTRIB | unix.FAN_MODIFY | unix.FAN_CLOSE_WRITE | unix.FAN_DELETE_SELF |
		unix.FAN_MOVE_SELF | unix.FAN_ONDIR
	// maxWatchChanges bounds the names one record holds (a few MiB at
	// most); past it the next checkpoint walks.
	maxWatchChanges = 16384
	// watchPace is the least time between two reads of a watcher's queue:
	// a burst of writes costs the daemon one wake-up per pace.
	watchPace = 100 * time.Millisecond
	// fileidIno32Gen is the handle type ext4 gives its files (the inode
	// number then its generation, 32 bits each).
	fileidIno32Gen = 1
	// fanEventInfoTypeDFIDName is an event's directory handle and name.
	fanEventInfoTypeDFIDName = 2
)

// changeWatch records the changes to one sandbox's writable filesystem.
type changeWatch struct {
	fd   int // the fanotify group
	fsid [2]int32
	mu   sync.Mutex
	buf  []byte
	// +checklocks:mu
	closed bool
	// +checklocks:mu
	lost bool
	// +checklocks:mu
	dirs map[uint64]map[string]struct{}
	// +checklocks:mu
	n int
	// events counts the events read.
	// +checklocks:mu
	events int64
}

// startWatch marks the filesystem of the directory upper.
func startWatch(upper int) (*changeWatch, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(upper, &sfs); err != nil {
		return nil, fmt.Errorf("watching the writable layer: %w", err)
	}
	p, err := thePoller()
	if err != nil {
		return nil, err
	}
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_DFID_NAME|unix.FAN_NONBLOCK|unix.FAN_CLOEXEC, unix.O_RDONLY|unix.O_LARGEFILE)
	if err != nil {
		return nil, fmt.Errorf("watching the writable layer: %w", err)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD|unix.FAN_MARK_FILESYSTEM, watchMask, upper, ""); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watching the writable layer: %w", err)
	}
	w := &changeWatch{fd: fd, fsid: sfs.Fsid.Val, buf: make([]byte, 16<<10), dirs: map[uint64]map[string]struct{}{}}
	if err := p.add(w); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watching the writable layer: %w", err)
	}
	return w, nil
}

// watchPoller drains the watchers whose queue has events, each at most
// once every watchPace: one epoll of the process, each watcher armed for
// one wake-up (EPOLLONESHOT) and armed again a pace after its drain, so a
// sandbox writing without pause costs the daemon one wake-up per pace
// and an idle one none.
type watchPoller struct {
	epfd int
	mu   sync.Mutex
	// +checklocks:mu
	ws map[int32]*changeWatch
}

var (
	pollerOnce sync.Once
	poller     *watchPoller
	pollerErr  error
)

func thePoller() (*watchPoller, error) {
	pollerOnce.Do(func() {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			pollerErr = fmt.Errorf("watching writable layers: %w", err)
			return
		}
		poller = &watchPoller{epfd: epfd, ws: map[int32]*changeWatch{}}
		go poller.run()
	})
	return poller, pollerErr
}

func (p *watchPoller) add(w *changeWatch) error {
	p.mu.Lock()
	p.ws[int32(w.fd)] = w
	p.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(w.fd)}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, w.fd, &ev); err != nil {
		p.mu.Lock()
		delete(p.ws, int32(w.fd))
		p.mu.Unlock()
		return err
	}
	return nil
}

func (p *watchPoller) run() {
	evs := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(p.epfd, evs, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		for _, ev := range evs[:n] {
			p.mu.Lock()
			w := p.ws[ev.Fd]
			p.mu.Unlock()
			if w == nil {
				continue
			}
			w.drain()
			time.AfterFunc(watchPace, func() { w.rearm(p.epfd) })
		}
	}
}

// drain reads the queue into the record.
func (w *changeWatch) drain() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if _, err := w.drainLocked(w.fd); err != nil || w.lost {
		w.loseLocked()
	}
}

// rearm arms the watcher's next wake-up.
func (w *changeWatch) rearm(epfd int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(w.fd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_MOD, w.fd, &ev); err != nil {
		w.loseLocked()
	}
}

func (w *changeWatch) lose() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.loseLocked()
}

// loseLocked drops the record and closes the group (never while its
// queue is being read: the descriptor's number may be reused at once).
//
// +checklocks:w.mu
func (w *changeWatch) loseLocked() {
	w.lost = true
	w.closeLocked()
}

// close stops the watcher.
func (w *changeWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closeLocked()
}

// +checklocks:w.mu
func (w *changeWatch) closeLocked() {
	if w.closed {
		return
	}
	w.closed = true
	if poller != nil {
		_ = unix.EpollCtl(poller.epfd, unix.EPOLL_CTL_DEL, w.fd, nil)
		poller.mu.Lock()
		delete(poller.ws, int32(w.fd))
		poller.mu.Unlock()
	}
	unix.Close(w.fd)
	w.dirs = nil
}

// take drains the queue and returns what was recorded since the last
// take, and starts a new record; ok false: the record is lost and the
// watcher closed (gone reports it).
func (w *changeWatch) take() (dirs map[uint64]map[string]struct{}, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, false
	}
	if _, err := w.drainLocked(w.fd); err != nil || w.lost {
		w.loseLocked()
		return nil, false
	}
	dirs = w.dirs
	w.dirs, w.n = map[uint64]map[string]struct{}{}, 0
	return dirs, true
}

// gone reports whether the watcher is closed.
func (w *changeWatch) gone() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// drainLocked reads the queue until it is empty or the record is lost,
// and reports whether it read anything.
//
// +checklocks:w.mu
func (w *changeWatch) drainLocked(fd int) (bool, error) {
	got := false
	for {
		n, err := unix.Read(fd, w.buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		if n <= 0 {
			return got, nil
		}
		got = true
		w.parseLocked(w.buf[:n])
		if w.lost {
			return got, nil
		}
	}
}

// parseLocked records the events in buf.
//
// +checklocks:w.mu
func (w *changeWatch) parseLocked(buf []byte) {
	const mdLen = int(unsafe.Sizeof(unix.FanotifyEventMetadata{}))
	for len(buf) >= mdLen {
		md := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[0]))
		if md.Vers != unix.FANOTIFY_METADATA_VERSION || int(md.Event_len) < mdLen || int(md.Event_len) > len(buf) {
			w.lost = true
			return
		}
		ev := buf[md.Metadata_len:md.Event_len]
		buf = buf[md.Event_len:]
		w.events++
		if md.Mask&unix.FAN_Q_OVERFLOW != 0 {
			w.lost = true
		}
		if md.Fd >= 0 {
			unix.Close(int(md.Fd)) // never with FID reports; closed should one come
		}
		if w.lost {
			continue
		}
		placed := false
		for len(ev) >= 4 {
			typ, l := ev[0], int(binary.LittleEndian.Uint16(ev[2:4]))
			if l < 4 || l > len(ev) {
				break
			}
			info := ev[:l]
			ev = ev[l:]
			if typ != fanEventInfoTypeDFIDName || len(info) < 20 {
				continue
			}
			fsid := [2]int32{int32(binary.LittleEndian.Uint32(info[4:8])), int32(binary.LittleEndian.Uint32(info[8:12]))}
			hb := int(binary.LittleEndian.Uint32(info[12:16]))
			ht := int32(binary.LittleEndian.Uint32(info[16:20]))
			if fsid != w.fsid || ht != fileidIno32Gen || hb != 8 || len(info) < 20+hb {
				break // not placed: the record is lost below
			}
			ino := uint64(binary.LittleEndian.Uint32(info[20:24]))
			name := info[20+hb:]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			w.addLocked(ino, name)
			placed = true
		}
		if !placed {
			w.lost = true
		}
	}
}

// +checklocks:w.mu
func (w *changeWatch) addLocked(ino uint64, name []byte) {
	names := w.dirs[ino]
	if names == nil {
		names = map[string]struct{}{}
		w.dirs[ino] = names
	}
	if _, ok := names[string(name)]; ok {
		return
	}
	if w.n >= maxWatchChanges {
		w.lost = true
		return
	}
	names[string(name)] = struct{}{}
	w.n++
}

// heldInodes returns the inode numbers of the files the processes pids
// (and each of their threads) hold open for writing or map shared: a
// write through a shared mapping makes no event, and a file written so
// keeps changing until its last such reference goes. The descriptors of
// sockets, pipes and anonymous inodes are left out (their mounts are the
// kernel's own, pseudoMounts); inodes of other filesystems come along (a
// descriptor names no filesystem the sandbox cannot remount): a number
// matching none of the layer's files costs nothing, and one matching
// costs a look at a file that did not change. The threads of a process
// share its table of descriptors unless one unshared it: each table is
// read once (kcmp). The processes are frozen.
func heldInodes(pids []int) (map[uint64]struct{}, error) {
	held := map[uint64]struct{}{}
	skip := pseudoMounts()
	for _, pid := range pids {
		p := "/proc/" + strconv.Itoa(pid)
		if err := mappedShared(p+"/maps", held); err != nil {
			return nil, err
		}
		tasks, err := os.ReadDir(p + "/task")
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		var read []int // a task of each table read
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || sharesFiles(tid, read) {
				continue
			}
			read = append(read, tid)
			fdTablesRead.Add(1)
			if err := openForWrite(filepath.Join(p, "task", t.Name(), "fdinfo"), held, skip); err != nil {
				return nil, err
			}
		}
	}
	return held, nil
}

// fdTablesRead counts the tables of descriptors heldInodes read, for
// tests.
var fdTablesRead atomic.Int64

// kcmpFiles is kcmp's comparison of two tasks' tables of descriptors.
const kcmpFiles = 2

// sharesFiles reports whether the task tid has the table of descriptors
// of one of tasks; a comparison the kernel refuses counts as another
// table.
func sharesFiles(tid int, tasks []int) bool {
	for _, o := range tasks {
		r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(o), uintptr(tid), kcmpFiles, 0, 0, 0)
		if errno == 0 && r == 0 {
			return true
		}
	}
	return false
}

var (
	pseudoOnce sync.Once
	pseudo     map[uint64]bool
)

// pseudoMounts returns the IDs of the kernel's own mounts of sockets,
// pipes, anonymous inodes (eventfd, epoll, timerfd, signalfd…, and
// pidfds) and memfds, read from the daemon's own descriptors of each
// kind: a descriptor on one of them is no file of a writable layer. Kinds
// that cannot be made here are not left out.
func pseudoMounts() map[uint64]bool {
	pseudoOnce.Do(func() {
		pseudo = map[uint64]bool{}
		var fds []int
		if fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
			fds = append(fds, fd)
		}
		var p [2]int
		if unix.Pipe2(p[:], unix.O_CLOEXEC) == nil {
			fds = append(fds, p[0], p[1])
		}
		if fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC); err == nil {
			fds = append(fds, fd)
		}
		if fd, err := unix.PidfdOpen(os.Getpid(), 0); err == nil {
			fds = append(fds, fd)
		}
		if fd, err := unix.MemfdCreate("fence-probe", unix.MFD_CLOEXEC); err == nil {
			fds = append(fds, fd)
		}
		for _, fd := range fds {
			if b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd)); err == nil {
				if id, ok := fdinfoField(b, "mnt_id", 10); ok {
					pseudo[id] = true
				}
			}
			unix.Close(fd)
		}
	})
	return pseudo
}

// fdinfoField returns the field k of an fdinfo file, a number in base.
func fdinfoField(b []byte, k string, base int) (uint64, bool) {
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		key, v, ok := bytes.Cut(line, []byte{':'})
		if ok && string(key) == k {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), base, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// mappedShared adds the inodes of the shared file mappings listed in the
// maps file at path.
func mappedShared(path string, held map[uint64]struct{}) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// address perms offset dev inode [path]
		fs := bytes.Fields(sc.Bytes())
		if len(fs) < 5 || len(fs[1]) < 4 || fs[1][3] != 's' {
			continue
		}
		if ino, err := strconv.ParseUint(string(fs[4]), 10, 64); err == nil && ino != 0 {
			held[ino] = struct{}{}
		}
	}
	return sc.Err()
}

// openForWrite adds the inodes of the descriptors open for writing listed
// in the fdinfo directory at dir, but for those on the mounts skip.
func openForWrite(dir string, held map[uint64]struct{}, skip map[uint64]bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return nil
		}
		return err
	}
	buf := make([]byte, 512)
	for _, e := range ents {
		fd, err := unix.Open(filepath.Join(dir, e.Name()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // closed meanwhile
		}
		n, _ := unix.Read(fd, buf)
		unix.Close(fd)
		b := buf[:max(n, 0)]
		flags, haveFlags := fdinfoField(b, "flags", 8)
		ino, haveIno := fdinfoField(b, "ino", 10)
		if mnt, ok := fdinfoField(b, "mnt_id", 10); ok && skip[mnt] {
			continue
		}
		if haveFlags && haveIno && flags&unix.O_ACCMODE != unix.O_RDONLY {
			held[ino] = struct{}{}
		}
	}
	return nil
}
