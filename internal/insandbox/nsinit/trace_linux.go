package nsinit

import (
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"
)

// The init's steps after its Config arrives, as timed for a Config with
// Trace set: each mark is the CLOCK_MONOTONIC time (which the sandbox's
// time namespace leaves as the host's) at which the step ended.
const (
	MarkConfig   = iota // the Config and its descriptors received
	MarkAttached        // template, layers and writable layer attached
	MarkMounted         // root overlay, /proc, /sys, /dev, binds, /tmp
	MarkEntered         // hostname, loopback, pivot_root, rlimits
	MarkClosed          // the setup's descriptors closed
	MarkGoAhead         // the daemon's go-ahead read
	MarkCgroupNS        // the cgroup namespace entered (before the go-ahead for an init Config.InCgroups, then nothing)
	MarkPrivs           // capabilities, no_new_privs and seccomp on every thread
	MarkServing         // the agent serves (Serving)
	NumMarks
)

// traceMagic follows Started in a traced answer, so that no error message
// can be read as one.
const traceMagic = "ftrc"

// TraceLen is the length of the traced answer to the go-ahead: Started,
// traceMagic and NumMarks little-endian nanosecond stamps.
const TraceLen = 1 + len(traceMagic) + 8*NumMarks

var (
	traced bool
	marks  [NumMarks]int64
)

// mark records the end of step i, when the Config asked for a trace.
func mark(i int) {
	if traced {
		marks[i] = Monotonic()
	}
}

// Monotonic is CLOCK_MONOTONIC in nanoseconds.
func Monotonic() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// startedAnswer is what Serving sends: Started alone, or with the marks.
func startedAnswer() []byte {
	if !traced {
		return []byte{Started}
	}
	b := append([]byte{Started}, traceMagic...)
	for _, m := range marks {
		b = binary.LittleEndian.AppendUint64(b, uint64(m))
	}
	return b
}

// ParseStarted reads the init's answer to the go-ahead: ok when it is
// Started, with the marks when it carries them (a Config with Trace set).
// Anything else is the init's error message.
func ParseStarted(b []byte) (marks []int64, ok bool, err error) {
	switch {
	case len(b) == 1 && b[0] == Started:
		return nil, true, nil
	case len(b) == TraceLen && b[0] == Started && string(b[1:1+len(traceMagic)]) == traceMagic:
		m := make([]int64, NumMarks)
		for i := range m {
			m[i] = int64(binary.LittleEndian.Uint64(b[1+len(traceMagic)+8*i:]))
		}
		return m, true, nil
	case len(b) == 0:
		return nil, false, errors.New("the agent exited before it served")
	}
	return nil, false, nil
}
