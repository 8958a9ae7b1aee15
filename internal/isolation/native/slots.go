package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	uidBase  = 1 << 24 // first host uid of slot 0
	uidRange = 65536   // uids per sandbox
	maxSlots = 32768   // uidBase + maxSlots*uidRange < 1<<32
)

// slots hands out uid-range slots. A slot is held by an exclusive flock on
// <dir>/<n>, so two fence processes on one host never share a slot and a
// crashed holder releases its slots with its death.
type slots struct {
	dir string

	mu sync.Mutex
	// +checklocks:mu
	next int
}

// slot is one held slot.
type slot struct {
	n int
	f *os.File
}

func newSlots(dir string) (*slots, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating slot directory: %w", err)
	}
	return &slots{dir: dir}, nil
}

// acquire takes the first free slot at or after the last one handed out.
func (s *slots) acquire() (*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < maxSlots; i++ {
		n := (s.next + i) % maxSlots
		f, err := os.OpenFile(filepath.Join(s.dir, strconv.Itoa(n)), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening slot: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		s.next = n + 1
		return &slot{n: n, f: f}, nil
	}
	return nil, fmt.Errorf("all %d sandbox slots are in use", maxSlots)
}

func (sl *slot) hostUID() uint32 { return uidBase + uint32(sl.n)*uidRange }

func (sl *slot) release() {
	if sl != nil && sl.f != nil {
		sl.f.Close()
		sl.f = nil
	}
}
