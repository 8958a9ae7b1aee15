package agent

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/agent/process"
)

// warmChildEnv makes the test binary a child of TestFirstRequestWorkDoneAhead
// (see TestMain): "ahead" prepares and builds the agent as the native
// backend's ready init does, "cold" only builds its handler.
const warmChildEnv = "FENCE_AGENT_WARM_CHILD"

// warmChild prints the heap allocations that the first of two runs of
// each piece of a first command's work makes beyond the second, in a
// fresh process: the thread count read when a command ends, and the end
// of a process stream.
func warmChild(mode string) {
	// No collection in what is counted (the first starts the collector's
	// goroutines, which count as allocations, and empties the pools).
	debug.SetGCPercent(-1)
	var b *built
	if mode == "ahead" {
		NoSpareThreads()
		Prepare()
		<-codecsWarmed // its allocations, beside, are not counted
		b = Build(Options{}).b
	} else {
		b = build(Options{})
	}
	h := b.procHandler
	extra := func(f func()) uint64 {
		n := [2]uint64{}
		for i := range n {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			f()
			runtime.ReadMemStats(&after)
			n[i] = after.Mallocs - before.Mallocs
		}
		return n[0] - min(n[0], n[1])
	}
	threads := extra(func() { process.TrimThreads(1 << 20) })
	stream := extra(func() { process.WarmStream(h) })
	fmt.Println(threads, stream)
}

// TestFirstRequestWorkDoneAhead: what a process builds on its first thread
// count read (the runtime's metrics table) and on its first stream's end
// (Connect's JSON encoder of the end-of-stream message) is built by
// Prepare and Build, in the native backend's ready init while it waits
// for a sandbox, not in the sandbox's first command. Counted in heap
// allocations of a fresh process (the first run against the second); a
// process that did not prepare shows that the count sees the work.
func TestFirstRequestWorkDoneAhead(t *testing.T) {
	run := func(mode string) (threads, stream uint64) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), warmChildEnv+"="+mode)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(stdout)
		if err != nil {
			t.Fatal(err)
		}
		// The agents of the tests beside this one reap every child of the
		// test process (they are its subreaper), this one's too: its
		// output tells that it ran to its end.
		_ = cmd.Wait()
		f := strings.Fields(string(out))
		if len(f) != 2 {
			t.Fatalf("%s child printed %q", mode, out)
		}
		a, _ := strconv.ParseUint(f[0], 10, 64)
		b, _ := strconv.ParseUint(f[1], 10, 64)
		return a, b
	}
	coldThreads, coldStream := run("cold")
	if coldThreads < 20 || coldStream < 50 {
		t.Fatalf("a fresh process's first runs allocate %d and %d more than its second: the count does not see the first-time work", coldThreads, coldStream)
	}
	threads, stream := run("ahead")
	// A few allocations of the goroutines Build started (more under the
	// race detector) may fall into a count: far fewer than the first-time
	// work's, which is at least twice them.
	if threads > coldThreads/2 {
		t.Errorf("after Prepare, the first thread count read allocates %d more than the second (%d without Prepare)", threads, coldThreads)
	}
	if stream > coldStream/2 {
		t.Errorf("after Build, the first stream's end allocates %d more than the second (%d without)", stream, coldStream)
	}
}
