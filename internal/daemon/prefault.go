package daemon

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// prefaultText maps the pages of this executable into the page tables in
// one call per mapping (MADV_POPULATE_READ), instead of one fault per
// first touch. The pages are the host's page cache, shared by every
// sandbox, so this costs page-table entries, not memory. A fresh agent
// otherwise pays a page fault on every code path it runs for the first
// time, which is most of what its first request costs on hosts where
// faults are expensive (nested virtualization). Best effort: kernels
// before 5.14 refuse the advice and nothing changes.
func prefaultText() {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || !strings.HasPrefix(fields[1], "r") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_POPULATE_READ)
	}
}
