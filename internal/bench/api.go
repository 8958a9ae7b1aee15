package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// Daemon is a running fence daemon the API measures talk to, started by the
// caller (in this process, so that its memory can be read).
type Daemon struct {
	URL, APIKey string
	// Pooled names the templates the daemon's warm pools serve.
	Pooled []string
	Stop   func() error
}

// DaemonStarter starts a daemon with the given warm-pool size (for its
// default template), also keeping that many sandboxes of each of
// warmTemplates started ahead (`fence serve --warm-template NAME=N`).
type DaemonStarter func(ctx context.Context, warmPool int, warmTemplates ...string) (*Daemon, error)

// sdkRoundTrip measures what an E2B SDK user does most: create a sandbox,
// run `echo hi` in it and kill it, through the daemon's API, per phase.
func sdkRoundTrip(ctx context.Context, d *Daemon, tmpl string, n int) []Result {
	name := "api create→run echo→kill, " + tmpl
	if slices.Contains(d.Pooled, tmpl) {
		name += " (warm pool)"
	}
	c := client.New(d.URL, d.APIKey)
	total := Result{Name: name}
	phases := []Result{{Name: "  phase: create"}, {Name: "  phase: run"}, {Name: "  phase: kill"}}
	for i := -1; i < n; i++ { // -1: warm-up
		t0 := time.Now()
		sb, err := c.Create(ctx, api.NewSandbox{TemplateID: tmpl})
		if err != nil {
			total.Err = err
			return []Result{total}
		}
		t1 := time.Now()
		var out bytesWriter
		st, err := sb.Envd().Run(ctx, client.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", "echo hi"}, Stdout: &out})
		t2 := time.Now()
		if kerr := sb.Kill(ctx); err == nil {
			err = kerr
		}
		t3 := time.Now()
		if err == nil && (st.ExitCode != 0 || string(out) != "hi\n") {
			err = fmt.Errorf("echo hi: %+v, output %q", st, out)
		}
		if err != nil {
			total.Err = err
			return []Result{total}
		}
		if i >= 0 {
			total.Samples = append(total.Samples, t3.Sub(t0))
			phases[0].Samples = append(phases[0].Samples, t1.Sub(t0))
			phases[1].Samples = append(phases[1].Samples, t2.Sub(t1))
			phases[2].Samples = append(phases[2].Samples, t3.Sub(t2))
		}
	}
	return append([]Result{total}, phases...)
}

type bytesWriter []byte

func (b *bytesWriter) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }

// densityClients is how many clients create sandboxes at once.
const densityClients = 8

// densityWindow is how many creates a rate at a given number of sandboxes
// alive is measured over.
const densityWindow = 50

// densityIdle is how long the daemon's CPU time with all the sandboxes
// idle is measured over: two of its rounds of readings (every 5 s).
const densityIdle = 10 * time.Second

// densityQuiet is how long the machine's CPU time with no sandbox alive is
// measured over, before the creates.
const densityQuiet = 3 * time.Second

// densityPeerRuns is how many one-shot runs of the peer give its median
// before the sandboxes are created and with them all idle.
const densityPeerRuns = 20

// density creates n idle sandboxes through the API with densityClients
// concurrent clients and reports how the create rate and this process's
// memory (the daemon's, plus the clients' few bytes per sandbox) change as
// they accumulate, then checks that every one still answers and kills them.
// With peer (bwrap's one-shot), it also reports how much slower the peer
// starts with the n sandboxes idle on the host than with none: the part
// of the slowdown that is the host kernel's, which every runtime pays.
func density(ctx context.Context, d *Daemon, tmpl string, n int, peer func(context.Context) error, out io.Writer) error {
	c := client.New(d.URL, d.APIKey)
	peerRun := func() Result {
		return measure("peer", densityPeerRuns, func(int) error { return peer(ctx) })
	}
	var peer0 Result
	if peer != nil {
		peer0 = peerRun()
	}
	pivot0 := kernelPivots(pivotRuns)
	tasks0 := hostTasks()
	// The whole machine's CPU time with none alive, to set beside its
	// time with the n idle: what idle sandboxes cost the host, the
	// daemon's share and everything else's (the agents, the kernel's
	// threads).
	quiet0 := machineBusy()
	select {
	case <-time.After(densityQuiet):
	case <-ctx.Done():
		return ctx.Err()
	}
	quietCPU := busySince(quiet0)
	runtime.GC()
	debug.FreeOSMemory()
	rss0, fds0, gr0, th0 := rss(), openFDs(), runtime.NumGoroutine(), threads()
	var (
		mu    sync.Mutex
		sbs   []*client.Sandbox
		stamp []time.Time               // when each create finished, in order
		cpuAt = map[int]time.Duration{} // this process's CPU time when the k-th create finished
		first error
	)
	next := make(chan struct{})
	go func() {
		defer close(next)
		for range n {
			select {
			case next <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for range densityClients {
		wg.Go(func() {
			for range next {
				timeout := int32(3600)
				sb, err := c.Create(ctx, api.NewSandbox{TemplateID: tmpl, Timeout: &timeout})
				mu.Lock()
				if err != nil {
					if first == nil {
						first = err
					}
					mu.Unlock()
					continue
				}
				sbs = append(sbs, sb)
				stamp = append(stamp, time.Now())
				if k := len(stamp); k == 10 || k == 10+densityWindow || k == n-densityWindow || k == n {
					cpuAt[k] = cpuTime()
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	created := time.Since(start)
	defer func() {
		kctx := context.WithoutCancel(ctx)
		kstart := time.Now()
		forEach(sbs, func(sb *client.Sandbox) { sb.Kill(kctx) })
		fmt.Fprintf(out, "  killing all %d: %s\n", len(sbs), ms(time.Since(kstart)))
	}()
	// A create that failed is reported, and the figures are still given
	// for the sandboxes that were created.
	var createErr error
	if first != nil {
		createErr = fmt.Errorf("density: %d of %d created, first error: %w", len(sbs), n, first)
		fmt.Fprintf(out, "  %v\n", createErr)
		if len(sbs) == 0 {
			return createErr
		}
		n = len(sbs)
	}
	// Settle, then read what the idle sandboxes cost the daemon: its CPU
	// time over densityIdle (readings of every sandbox's use, its
	// network stacks' timers), then its memory.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	// Every process's CPU time is read around the window too (outside
	// it: the reading is this process's work), to name where the
	// machine's time goes besides the daemon.
	procs0 := sampleProcs()
	idle0, machine0 := cpuTime(), machineBusy()
	select {
	case <-time.After(densityIdle):
	case <-ctx.Done():
		return ctx.Err()
	}
	idleCPU, machineCPU := cpuTime()-idle0, busySince(machine0)
	procsN := sampleProcs()
	tasksN := hostTasks()
	var peerN Result
	if peer != nil && peer0.Err == nil {
		peerN = peerRun()
	}
	var pivotN Result
	if pivot0.Err == nil {
		pivotN = kernelPivots(pivotRuns)
	}
	rssLive := rss() // as the host sees the daemon, garbage included
	runtime.GC()
	debug.FreeOSMemory()
	rssN := rss()
	if path := os.Getenv("FENCE_BENCH_HEAP_PROFILE"); path != "" {
		// What the idle sandboxes hold in the daemon's heap, for pprof.
		if err := writeHeapProfile(path); err != nil {
			fmt.Fprintf(out, "  heap profile: %v\n", err)
		}
	}
	var mstat runtime.MemStats
	runtime.ReadMemStats(&mstat)
	w := max(10, n/10)
	early, late := rate(stamp, start, 0, min(w, len(stamp))), rate(stamp, start, max(0, len(stamp)-w), len(stamp))
	fmt.Fprintf(out, "density: %d idle %s sandboxes through the API, %d clients, in %.1f s\n", n, tmpl, densityClients, created.Seconds())
	fmt.Fprintf(out, "  creates per second: first %d %.1f, last %d %.1f (ratio %.2f)\n", w, early, w, late, late/early)
	var createRatio float64 // at n alive against 10, when measured
	if len(stamp) >= 2*densityWindow+10 {
		// With about 10 sandboxes alive (past the clients' ramp-up) and
		// with all but the last few alive.
		at10 := rate(stamp, start, 10, 10+densityWindow)
		atN := rate(stamp, start, len(stamp)-densityWindow, len(stamp))
		createRatio = atN / at10
		fmt.Fprintf(out, "  creates per second at 10 alive %.1f, at %d alive %.1f (ratio %.2f; windows of %d creates)\n",
			at10, len(stamp)-densityWindow, atN, createRatio, densityWindow)
		// The daemon's CPU time per create over the same windows: its
		// own work for the creates, the programs it ran and waited for
		// (mkfs.ext4), and its background work for the sandboxes alive
		// meanwhile, which per create grows when the machine's other load
		// slows the creates (the idle figure below is that work alone).
		if c0, ok := cpuAt[10]; ok && n == len(stamp) {
			c1, c2, c3 := cpuAt[10+densityWindow], cpuAt[n-densityWindow], cpuAt[n]
			fmt.Fprintf(out, "  daemon CPU time per create at 10 alive %s, at %d alive %s\n",
				ms((c1-c0)/densityWindow), n-densityWindow, ms((c3-c2)/densityWindow))
		}
	}
	fmt.Fprintf(out, "  daemon CPU time with %d idle sandboxes: %.1f ms per second (over %s)\n",
		n, perSecond(idleCPU, densityIdle), densityIdle)
	if quietCPU >= 0 && machineCPU >= 0 {
		busy, share := perSecond(machineCPU, densityIdle), ""
		if cpus := machineCPUs(); cpus > 0 {
			// What the creates at n alive no longer have, whatever a
			// create itself costs.
			share = fmt.Sprintf(" (%.0f%% of its %d CPUs)", busy/10/float64(cpus), cpus)
		}
		fmt.Fprintf(out, "  machine CPU time with the %d idle: %.1f ms per second%s, with none %.1f (every process and the kernel's threads, from /proc/stat)\n",
			n, busy, share, perSecond(quietCPU, densityQuiet))
		if procs0 != nil && procsN != nil {
			// Each process's time is counted to the tick, so over
			// thousands of processes the parts do not add up to the
			// machine's to the millisecond.
			busiest := describeBusiest(byCommand(procs0, procsN, os.Getpid()), 5, densityIdle)
			fmt.Fprintf(out, "    of which the daemon %.1f; the busiest other commands %s\n",
				perSecond(idleCPU, densityIdle), busiest)
		}
	}
	fmt.Fprintf(out, "  daemon resident memory: %.1f MiB more, %.3f MiB per idle sandbox after a GC (%.3f before it; Go heap in use %.1f MiB)\n",
		mib(rssN-rss0), mib(rssN-rss0)/float64(n), mib(rssLive-rss0)/float64(n), mib(int64(mstat.HeapInuse)))
	fmt.Fprintf(out, "  daemon per idle sandbox: %.1f descriptors, %.1f goroutines, %.2f threads\n",
		float64(openFDs()-fds0)/float64(n), float64(runtime.NumGoroutine()-gr0)/float64(n), float64(threads()-th0)/float64(n))
	if tasks0 > 0 && tasksN > 0 {
		fmt.Fprintf(out, "  threads on the host: %d before, %d with the sandboxes idle (%.1f per sandbox)\n",
			tasks0, tasksN, float64(tasksN-tasks0)/float64(n))
	}
	if err := errors.Join(pivot0.Err, pivotN.Err); err != nil {
		fmt.Fprintf(out, "  the kernel's pivot_root: %v\n", err)
	} else {
		// Part of every start's cost that grows with the threads on the
		// host, whichever runtime starts (kernelPivot).
		fmt.Fprintf(out, "  the kernel's pivot_root with none alive %s, with the %d idle %s (medians of %d; it walks every thread on the host, once per start of fence or runc, twice of bwrap)\n",
			ms(pivot0.quantile(0.5)), n, ms(pivotN.quantile(0.5)), pivotRuns)
	}
	switch {
	case peer == nil:
	case peer0.Err != nil || peerN.Err != nil:
		fmt.Fprintf(out, "  bwrap /bin/true: failed: %v\n", errors.Join(peer0.Err, peerN.Err))
	default:
		// As a rate, comparable with the creates per second above.
		b0, bN := peer0.quantile(0.5), peerN.quantile(0.5)
		peerRatio := float64(b0) / float64(bN)
		fmt.Fprintf(out, "  bwrap /bin/true with none alive %s, with the %d idle %s (as a rate, ratio %.2f; medians of %d)\n",
			ms(b0), n, ms(bN), peerRatio, densityPeerRuns)
		if createRatio > 0 {
			// Above 1: the creates slowed down less than the host's own
			// sandbox starts did.
			fmt.Fprintf(out, "  fence's create-rate ratio against bwrap's: %.2f\n", createRatio/peerRatio)
		}
	}
	// Every sandbox still answers.
	astart := time.Now()
	var bad []string
	forEach(sbs, func(sb *client.Sandbox) {
		st, err := sb.Envd().Run(ctx, client.ProcessSpec{Cmd: "/bin/true"})
		if err != nil || st.ExitCode != 0 {
			mu.Lock()
			bad = append(bad, fmt.Sprintf("%s: %v %+v", sb.ID(), err, st))
			mu.Unlock()
		}
	})
	fmt.Fprintf(out, "  exec true in every sandbox: %d of %d answered (%s)\n", len(sbs)-len(bad), len(sbs), ms2(time.Since(astart)))
	if len(bad) > 0 {
		slices.Sort(bad)
		return errors.Join(createErr, fmt.Errorf("density: %d sandboxes did not answer, e.g. %s", len(bad), bad[0]))
	}
	return createErr
}

// forEach calls f with every sandbox, densityClients at a time.
func forEach(sbs []*client.Sandbox, f func(*client.Sandbox)) {
	var wg sync.WaitGroup
	work := make(chan *client.Sandbox)
	for range densityClients {
		wg.Go(func() {
			for sb := range work {
				f(sb)
			}
		})
	}
	for _, sb := range sbs {
		work <- sb
	}
	close(work)
	wg.Wait()
}

func ms2(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// rate is how many creates per second finished between the i-th and j-th.
func rate(stamp []time.Time, start time.Time, i, j int) float64 {
	if j <= i {
		return 0
	}
	from := start
	if i > 0 {
		from = stamp[i-1]
	}
	d := stamp[j-1].Sub(from)
	if d <= 0 {
		return 0
	}
	return float64(j-i) / d.Seconds()
}

// cpuTime is the CPU time this process and its waited-for children used.
func cpuTime() time.Duration {
	var self, children syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) != nil || syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children) != nil {
		return 0
	}
	var t time.Duration
	for _, tv := range []syscall.Timeval{self.Utime, self.Stime, children.Utime, children.Stime} {
		t += time.Duration(tv.Nano())
	}
	return t
}

// machineBusy is the CPU time the whole machine spent out of its idle loop
// (user, nice, system, irq and softirq in /proc/stat; a guest's steal
// time is not its own), -1 if it cannot be read.
func machineBusy() time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return -1
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return -1
		}
		ticks += v
	}
	return clockTicks(ticks)
}

// machineCPUs is the number of CPUs /proc/stat counts machineBusy over
// (its cpuN lines), 0 if it cannot be read.
func machineCPUs() int {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	n := 0
	for line := range strings.Lines(string(raw)) {
		if len(line) > 3 && strings.HasPrefix(line, "cpu") && line[3] >= '0' && line[3] <= '9' {
			n++
		}
	}
	return n
}

// clockTicks is n of the kernel's clock ticks (/proc's unit of CPU time,
// USER_HZ, which Linux fixes at 100 for every architecture fence runs on)
// as a duration.
func clockTicks(n int64) time.Duration { return time.Duration(n) * 10 * time.Millisecond }

// busySince is the machine's CPU time since machineBusy returned t0, -1 if
// either reading failed.
func busySince(t0 time.Duration) time.Duration {
	t1 := machineBusy()
	if t0 < 0 || t1 < 0 {
		return -1
	}
	return t1 - t0
}

// hostTasks is the number of threads on the host (the fourth field of
// /proc/loadavg), 0 if it cannot be read.
func hostTasks() int {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) < 4 {
		return 0
	}
	_, total, ok := strings.Cut(f[3], "/")
	if !ok {
		return 0
	}
	v, err := strconv.Atoi(total)
	if err != nil {
		return 0
	}
	return v
}

// openFDs counts this process's open descriptors, threads its OS threads.
func openFDs() int { return entries("/proc/self/fd") }
func threads() int { return entries("/proc/self/task") }

func entries(dir string) int {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	return len(ents)
}

// writeHeapProfile writes this process's heap profile to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
