package bench

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		line  string
		comm  string
		start int64
		cpu   time.Duration
		ok    bool
	}{
		// A kernel thread, and a name with a space and parentheses.
		{"83 (kdamond.0) S 2 0 0 0 -1 2129984 0 0 0 0 17 4632 0 0 20 0 1 0 410 0 0", "kdamond.0", 410, 46490 * time.Millisecond, true},
		{"7 (a) b (c)) R 1 7 7 0 -1 4194560 0 0 0 0 3 4 0 0 20 0 1 0 9 0 0", "a) b (c)", 9, 70 * time.Millisecond, true},
		{"7 (short) R 1 7 7 0 -1 4194560 0 0 0 0 3 4 0 0", "", 0, 0, false},
		{"7 (bad) R 1 7 7 0 -1 4194560 0 0 0 0 x 4 0 0 20 0 1 0 9 0 0", "", 0, 0, false},
		{"no parentheses", "", 0, 0, false},
	} {
		got, ok := parseProcStat(tc.line)
		if ok != tc.ok || got.comm != tc.comm || got.start != tc.start || got.cpu != tc.cpu {
			t.Errorf("parseProcStat(%q) = %+v, %v; want {%s %d %v}, %v", tc.line, got, ok, tc.comm, tc.start, tc.cpu, tc.ok)
		}
	}
}

func TestByCommand(t *testing.T) {
	ms := time.Millisecond
	a := procTimes{
		1:  {"process_api", 1, 1000 * ms},
		2:  {"kworker/u8:3-loop1", 5, 10 * ms},
		3:  {"kworker/1:0-dio/vda", 5, 0},
		4:  {"fence-sandbox-8", 90, 20 * ms},
		5:  {"fence-sandbox-4", 91, 20 * ms},
		6:  {"fence", 80, 500 * ms}, // the daemon: skipped
		7:  {"gone", 95, 0},         // exited before b
		8:  {"bash", 95, 0},         // its PID reused by b
		10: {"idle", 96, 50 * ms},
		11: {"\x1b[2Jx", 97, 0},
	}
	b := procTimes{
		1:  {"process_api", 1, 3590 * ms},
		2:  {"kworker/u8:3-flush-7:1", 5, 40 * ms}, // a worker renamed with its work
		3:  {"kworker/1:0-dio/vda", 5, 30 * ms},
		4:  {"fence-sandbox-8", 90, 50 * ms},
		5:  {"fence-sandbox-4", 91, 40 * ms},
		6:  {"fence", 80, 900 * ms},
		8:  {"bash", 99, 900 * ms},
		9:  {"new", 99, 900 * ms}, // started after a
		10: {"idle", 96, 50 * ms},
		11: {"\x1b[2Jx", 97, 10 * ms}, // a name with a terminal escape
	}
	got := byCommand(a, b, 6)
	want := []commandCPU{
		{"process_api", 1, 2590 * ms},
		{"kworker", 2, 60 * ms},
		{"fence-sandbox", 2, 50 * ms},
		{"?[2Jx", 1, 10 * ms},
		{"idle", 1, 0},
	}
	if len(got) != len(want) {
		t.Fatalf("byCommand = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("byCommand[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if s := describeBusiest(got, 2, 10*time.Second); s != "process_api 259.0, kworker 6.0 (2 processes)" {
		t.Errorf("describeBusiest = %q", s)
	}
	if s := describeBusiest(got[4:], 5, time.Second); s != "none" {
		t.Errorf("describeBusiest of idle commands = %q", s)
	}
}

// TestSampleProcsSeesThisProcess reads the real /proc: this process is
// there under its own name, and its CPU time grows as it works.
func TestSampleProcsSeesThisProcess(t *testing.T) {
	a := sampleProcs()
	self, ok := a[os.Getpid()]
	if !ok {
		t.Fatalf("this process (%d) is not among the %d sampled", os.Getpid(), len(a))
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(comm)); self.comm != want {
		t.Errorf("comm %q, want %q", self.comm, want)
	}
	if _, ok := a[1]; !ok {
		t.Errorf("PID 1 is not among the %d sampled", len(a))
	}
	// Work until the kernel has counted at least two ticks more.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		x := 0
		for i := range 10_000_000 {
			x += i
		}
		_ = x
		if b := sampleProcs(); b[os.Getpid()].cpu-self.cpu >= 20*time.Millisecond {
			return
		}
	}
	t.Errorf("this process's CPU time did not grow in 10 s of work")
}

// machineCPUs counts every CPU /proc/stat sums over: at least those this
// process may run on.
func TestMachineCPUs(t *testing.T) {
	if n, want := machineCPUs(), runtime.NumCPU(); n < want {
		t.Errorf("machineCPUs() = %d, want at least runtime.NumCPU() = %d", n, want)
	}
}
