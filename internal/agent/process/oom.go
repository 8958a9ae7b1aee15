package process

import (
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// childOOMBoost is how far above the agent's OOM score adjustment the
// processes it starts are placed when the agent's own is not negative
// (the daemon could not lower it).
const childOOMBoost = 500

// oomScores keeps the agent last in the OOM killer's order within its
// sandbox. The daemon lowers the agent's oom_score_adj from the host side
// where it can (CAP_SYS_RESOURCE); every process the agent starts gets a
// higher one: the ordinary 0 when the agent's is negative, else the
// agent's plus childOOMBoost. A child inherits its parent's value at fork,
// so the agent raises its own to the child's value around each fork and
// lowers it back after; lowering back to a value it held before needs no
// privilege, and nothing inside the sandbox can go below the agent's.
//
// The agent's score is read at the first fork, not when the service is
// made: an agent's services may be made before its sandbox exists (a
// sandbox's init makes them while it waits), and the daemon lowers the
// score only then.
type oomScores struct {
	once  sync.Once
	fd    int // /proc/self/oom_score_adj, -1 if unusable
	agent []byte
	child []byte
}

func newOOMScores() *oomScores { return &oomScores{fd: -1} }

// read learns the agent's score and opens the file to change it.
func (o *oomScores) read() {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return
	}
	agent, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	child := 0
	if agent >= 0 {
		child = min(agent+childOOMBoost, 1000)
	}
	if child == agent {
		return
	}
	fd, err := unix.Open("/proc/self/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	o.fd, o.agent, o.child = fd, []byte(strconv.Itoa(agent)), []byte(strconv.Itoa(child))
}

// learn reads the agent's score now, if it has not been read. Call it
// only once the daemon has set it (see oomScores).
func (o *oomScores) learn() { o.once.Do(o.read) }

// forChild sets the agent's score to the one its children get and returns
// the func that restores it.
func (o *oomScores) forChild() (restore func()) {
	o.once.Do(o.read)
	if o.fd < 0 {
		return func() {}
	}
	if _, err := unix.Pwrite(o.fd, o.child, 0); err != nil {
		return func() {}
	}
	return func() { _, _ = unix.Pwrite(o.fd, o.agent, 0) }
}
