package egress

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/testutil"
)

// countSyscalls returns how many times f entered each of the system calls
// named (as in /sys/kernel/tracing/events/syscalls/sys_enter_NAME) on the
// calling goroutine's thread: f must not hand its work to other
// goroutines. It counts with the kernel's tracepoints (perf_event_open),
// which needs root.
func countSyscalls(t *testing.T, names []string, f func()) map[string]uint64 {
	t.Helper()
	testutil.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fds := make(map[string]int, len(names))
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, n := range names {
		raw, err := os.ReadFile("/sys/kernel/tracing/events/syscalls/sys_enter_" + n + "/id")
		if err != nil {
			t.Fatalf("the kernel's syscall tracepoints: %v", err)
		}
		id, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		attr := unix.PerfEventAttr{
			Type:   unix.PERF_TYPE_TRACEPOINT,
			Config: id,
			Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
			Bits:   unix.PerfBitDisabled,
		}
		fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err != nil {
			t.Fatalf("perf_event_open for %s: %v", n, err)
		}
		fds[n] = fd
	}
	for _, fd := range fds {
		if err := unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
			t.Fatal(err)
		}
	}
	f()
	for _, fd := range fds {
		_ = unix.IoctlSetInt(fd, unix.PERF_EVENT_IOC_DISABLE, 0)
	}
	counts := make(map[string]uint64, len(names))
	for n, fd := range fds {
		var buf [8]byte
		if _, err := unix.Read(fd, buf[:]); err != nil {
			t.Fatal(err)
		}
		counts[n] = *(*uint64)(unsafe.Pointer(&buf[0]))
	}
	return counts
}
