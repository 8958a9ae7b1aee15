package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// Log is the file the daemon logs to, "" when it keeps no log: a
	// measure that fails against it reports the daemon's last errors
	// from it, and where it is.
	Log  string
	Stop func() error
}

// DaemonStarter starts a daemon with the given warm-pool size (for its
// default template), also keeping that many sandboxes of each of
// warmTemplates started ahead (`fence serve --warm-template NAME=N`).
type DaemonStarter func(ctx context.Context, warmPool int, warmTemplates ...string) (*Daemon, error)

// sdkRoundTrip measures what an E2B SDK user does most: create a sandbox,
// run `echo hi` in it and kill it, through the daemon's API, per phase.
// The run phase is split as an SDK sees it: its start (the request through
// the daemon's proxy to the agent, the agent's fork and exec, the start
// event back), the first output, and the end (the command's exit, the end
// event and the stream's end); with the HTTP connections dialled per round
// trip (a client that reuses its keep-alive connections dials none).
func sdkRoundTrip(ctx context.Context, d *Daemon, tmpl string, n int) []Result {
	name := "api create→run echo→kill, " + tmpl
	if slices.Contains(d.Pooled, tmpl) {
		name += " (warm pool)"
	}
	c := client.New(d.URL, d.APIKey)
	total := Result{Name: name}
	phases := []Result{{Name: "  phase: create"}, {Name: "  phase: run"},
		{Name: "    run: to the start event"}, {Name: "    run: start to first output"}, {Name: "    run: output to the end"},
		{Name: "  phase: kill"}}
	var dials atomic.Int64
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		ConnectStart: func(string, string) { dials.Add(1) },
	})
	var dials0 int64
	for i := -1; i < n; i++ { // -1: warm-up
		if i == 0 {
			dials0 = dials.Load()
		}
		t0 := time.Now()
		sb, err := c.Create(ctx, api.NewSandbox{TemplateID: tmpl})
		if err != nil {
			total.Err = err
			return []Result{total}
		}
		t1 := time.Now()
		out := &stampWriter{}
		var st client.ExitStatus
		var tStart time.Time
		p, err := sb.Envd().Start(ctx, client.ProcessSpec{Cmd: "/bin/sh", Args: []string{"-c", "echo hi"}, Stdout: out})
		if err == nil {
			tStart = time.Now()
			st, err = p.Wait()
		}
		t2 := time.Now()
		if kerr := sb.Kill(ctx); err == nil {
			err = kerr
		}
		t3 := time.Now()
		if err == nil && (st.ExitCode != 0 || string(out.b) != "hi\n") {
			err = fmt.Errorf("echo hi: %+v, output %q", st, out.b)
		}
		if err != nil {
			total.Err = err
			return []Result{total}
		}
		if i >= 0 {
			tOut := out.first
			if tOut.IsZero() || tOut.Before(tStart) {
				tOut = tStart // the output came with the start event
			}
			total.Samples = append(total.Samples, t3.Sub(t0))
			for k, d := range []time.Duration{t1.Sub(t0), t2.Sub(t1), tStart.Sub(t1), tOut.Sub(tStart), t2.Sub(tOut), t3.Sub(t2)} {
				phases[k].Samples = append(phases[k].Samples, d)
			}
		}
	}
	total.note = fmt.Sprintf("%.2f HTTP dials per round trip", float64(dials.Load()-dials0)/float64(n))
	return append([]Result{total}, phases...)
}

// stampWriter keeps what is written and when the first write came.
type stampWriter struct {
	b     []byte
	first time.Time
}

func (w *stampWriter) Write(p []byte) (int, error) {
	if w.first.IsZero() {
		w.first = time.Now()
	}
	w.b = append(w.b, p...)
	return len(p), nil
}

// apiExec measures an exec of /bin/true in a running sandbox through the
// daemon's API (its proxy to the agent, as an SDK's commands.run goes),
// its samples alternated with the host's fork+exec of the same program
// (hostTrue; with peers only), so that both see the same machine. Set
// beside fenceExec's exec straight to the agent, the difference is the
// daemon's hop.
func apiExec(ctx context.Context, d *Daemon, rootfs, tmpl string, n int, peers bool) []Result {
	fence := Result{Name: "api exec true in a running sandbox"}
	host := Result{Name: baselineName + " (beside the api exec)", peer: true}
	c := client.New(d.URL, d.APIKey)
	sb, err := c.Create(ctx, api.NewSandbox{TemplateID: tmpl})
	if err != nil {
		fence.Err = err
		return []Result{fence}
	}
	defer sb.Kill(context.WithoutCancel(ctx))
	e := sb.Envd().WithUser("root")
	for i := -1; i < n; i++ { // -1: warm-up
		start := time.Now()
		st, err := e.Run(ctx, client.ProcessSpec{Cmd: "/bin/true"})
		if err == nil && st.ExitCode != 0 {
			err = fmt.Errorf("/bin/true: %+v", st)
		}
		if err != nil {
			fence.Err = err
			return []Result{fence}
		}
		if i >= 0 {
			fence.Samples = append(fence.Samples, time.Since(start))
		}
		if !peers {
			continue
		}
		start = time.Now()
		if err := hostTrue(ctx, rootfs); err != nil {
			host.Err = err
			return []Result{fence, host}
		}
		if i >= 0 {
			host.Samples = append(host.Samples, time.Since(start))
		}
	}
	if !peers {
		return []Result{fence}
	}
	return []Result{fence, host}
}

// densityClients is how many clients create sandboxes at once.
const densityClients = 8

// densityWindow is how many creates a rate at a given number of sandboxes
// alive is measured over.
const densityWindow = 50

// densityCPUTarget is fence's target for the daemon's CPU time per create
// with N alive against its CPU time per create with 10 alive.
const densityCPUTarget = 1.2

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
	c := client.New(d.URL, d.APIKey, client.WithHTTPClient(densityHTTP()))
	var peerRun func() Result
	if peer != nil {
		peerRun = func() Result {
			return measure("peer", densityPeerRuns, func(int) error { return peer(ctx) })
		}
	}
	before, err := readBeforeDensity(ctx, peerRun)
	if err != nil {
		return err
	}
	cr := createIdle(ctx, c, tmpl, n)
	defer func() {
		kctx := context.WithoutCancel(ctx)
		kstart := time.Now()
		forEach(cr.sbs, func(sb *client.Sandbox) { sb.Kill(kctx) })
		fmt.Fprintf(out, "  killing all %d: %s\n", len(cr.sbs), ms(time.Since(kstart)))
	}()
	// A create that failed is reported, and the figures are still given
	// for the sandboxes that were created.
	var createErr error
	if cr.first != nil {
		createErr = fmt.Errorf("density: %d of %d created, first error: %w", len(cr.sbs), n, cr.first)
		fmt.Fprintf(out, "  %v\n", createErr)
		if len(cr.sbs) == 0 {
			return createErr
		}
		n = len(cr.sbs)
	}
	if before.peer.Err != nil {
		peerRun = nil // no comparison to make
	}
	idle, err := readIdleDensity(ctx, peerRun, before.pivot.Err == nil, out)
	if err != nil {
		return err
	}
	createRatio := cr.report(out, tmpl, n)
	idle.reportCPU(out, before.quietCPU, n)
	reportDensityCosts(out, before, idle, n)
	reportDensityPeer(out, peer != nil, before, idle, n, createRatio)
	if err := answerAll(ctx, cr.sbs, out); err != nil {
		return errors.Join(createErr, err)
	}
	return createErr
}

// densityHTTP is the client of density's creates and execs: it runs in
// the daemon's process and so spends the daemon's descriptors, which the
// n idle sandboxes may have brought close to its limit. It holds at most
// densityClients connections and keeps each for the next request, where
// a default transport keeps two idle and dials anew for every other one.
func densityHTTP() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		MaxConnsPerHost:     densityClients,
		MaxIdleConnsPerHost: densityClients,
		IdleConnTimeout:     time.Minute,
		ForceAttemptHTTP2:   false,
	}}
}

// densityBefore is what density reads before the creates.
type densityBefore struct {
	peer, pivot Result
	tasks       int           // threads on the host
	quietCPU    time.Duration // the machine's over densityQuiet
	rss         int64
	fds, gr, th int // this process's descriptors, goroutines and threads
}

// readBeforeDensity reads the host and this process with no sandbox
// alive: the peer's starts (with peerRun), the kernel's pivot_root, and
// the machine's CPU time over densityQuiet, then this process's memory
// and resources after a GC.
func readBeforeDensity(ctx context.Context, peerRun func() Result) (densityBefore, error) {
	var b densityBefore
	if peerRun != nil {
		b.peer = peerRun()
	}
	b.pivot = kernelPivots(pivotRuns)
	b.tasks = hostTasks()
	// The whole machine's CPU time with none alive, to set beside its
	// time with the n idle: what idle sandboxes cost the host, the
	// daemon's share and everything else's (the agents, the kernel's
	// threads).
	quiet0 := machineBusy()
	select {
	case <-time.After(densityQuiet):
	case <-ctx.Done():
		return b, ctx.Err()
	}
	b.quietCPU = busySince(quiet0)
	runtime.GC()
	debug.FreeOSMemory()
	b.rss, b.fds, b.gr, b.th = rss(), openFDs(), runtime.NumGoroutine(), threads()
	return b, nil
}

// densityCreates is what the creates of density made and when.
type densityCreates struct {
	sbs   []*client.Sandbox
	stamp []time.Time           // when each create finished, in order
	cpuAt map[int]time.Duration // this process's CPU time when the k-th create finished
	first error                 // the first create's error
	prof  *cpuProfiles
	start time.Time
	took  time.Duration
}

// createIdle creates n sandboxes of tmpl, densityClients at a time, and
// records when each one was made.
func createIdle(ctx context.Context, c *client.Client, tmpl string, n int) *densityCreates {
	cr := &densityCreates{cpuAt: map[int]time.Duration{}, prof: newCPUProfiles()}
	var mu sync.Mutex
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
	cr.start = time.Now()
	var wg sync.WaitGroup
	for range densityClients {
		wg.Go(func() {
			for range next {
				timeout := int32(3600)
				sb, err := c.Create(ctx, api.NewSandbox{TemplateID: tmpl, Timeout: &timeout})
				mu.Lock()
				if err != nil {
					if cr.first == nil {
						cr.first = err
					}
					mu.Unlock()
					continue
				}
				cr.sbs = append(cr.sbs, sb)
				cr.stamp = append(cr.stamp, time.Now())
				if k := len(cr.stamp); k == 10 || k == 10+densityWindow || k == n-densityWindow || k == n {
					cr.cpuAt[k] = cpuTime()
					cr.prof.window(k, n)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	cr.took = time.Since(cr.start)
	return cr
}

// densityIdleReadings is what density reads with the sandboxes idle.
type densityIdleReadings struct {
	procs0, procsN      procTimes     // every process's CPU time around the window
	idleCPU, machineCPU time.Duration // the daemon's and the machine's over densityIdle
	tasks               int
	peer, pivot         Result
	rssLive, rss        int64 // before and after a GC
	mstat               runtime.MemStats
}

// readIdleDensity lets the sandboxes settle, then reads what they cost
// idle: the daemon's and the machine's CPU time over densityIdle, the
// host's threads, the peer's starts (with peerRun) and the kernel's
// pivot_root (with pivot), and last the daemon's memory (and its heap
// profile, to FENCE_BENCH_HEAP_PROFILE).
func readIdleDensity(ctx context.Context, peerRun func() Result, pivot bool, out io.Writer) (*densityIdleReadings, error) {
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r := &densityIdleReadings{}
	// Every process's CPU time is read around the window too (outside
	// it: the reading is this process's work), to name where the
	// machine's time goes besides the daemon.
	r.procs0 = sampleProcs()
	// That reading of every process leaves garbage in this process, the
	// daemon's, that would start a GC cycle over the daemon's heap (all
	// the sandboxes' state, hundreds of MiB) inside the window: it is
	// collected before, so the window holds the daemon's own work.
	runtime.GC()
	prof := newCPUProfiles()
	prof.start("idle")
	idle0, machine0 := cpuTime(), machineBusy()
	select {
	case <-time.After(densityIdle):
	case <-ctx.Done():
		prof.stop()
		return nil, ctx.Err()
	}
	r.idleCPU, r.machineCPU = cpuTime()-idle0, busySince(machine0)
	prof.stop()
	r.procsN = sampleProcs()
	r.tasks = hostTasks()
	if peerRun != nil {
		r.peer = peerRun()
	}
	if pivot {
		r.pivot = kernelPivots(pivotRuns)
	}
	r.rssLive = rss() // as the host sees the daemon, garbage included
	runtime.GC()
	debug.FreeOSMemory()
	r.rss = rss()
	if path := os.Getenv("FENCE_BENCH_HEAP_PROFILE"); path != "" {
		// What the idle sandboxes hold in the daemon's heap, for pprof.
		if err := writeHeapProfile(path); err != nil {
			fmt.Fprintf(out, "  heap profile: %v\n", err)
		}
	}
	runtime.ReadMemStats(&r.mstat)
	return r, nil
}

// report writes the create rates: early against late, and at 10 alive
// against n alive (the ratio it gives, 0 when there were too few to
// measure), with the daemon's CPU time per create at both.
func (cr *densityCreates) report(out io.Writer, tmpl string, n int) (createRatio float64) {
	stamp, start := cr.stamp, cr.start
	w := max(10, n/10)
	early, late := rate(stamp, start, 0, min(w, len(stamp))), rate(stamp, start, max(0, len(stamp)-w), len(stamp))
	fmt.Fprintf(out, "density: %d idle %s sandboxes through the API, %d clients, in %.1f s\n", n, tmpl, densityClients, cr.took.Seconds())
	fmt.Fprintf(out, "  creates per second: first %d %.1f, last %d %.1f (ratio %.2f)\n", w, early, w, late, late/early)
	if len(stamp) < 2*densityWindow+10 {
		return 0
	}
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
	if c0, ok := cr.cpuAt[10]; ok && n == len(stamp) && cr.cpuAt[10+densityWindow] > c0 {
		c1, c2, c3 := cr.cpuAt[10+densityWindow], cr.cpuAt[n-densityWindow], cr.cpuAt[n]
		at10, atN := (c1-c0)/densityWindow, (c3-c2)/densityWindow
		fmt.Fprintf(out, "  daemon CPU time per create at 10 alive %s, at %d alive %s (ratio %.2f; target ≤ %.1f)\n",
			ms(at10), n-densityWindow, ms(atN), float64(atN)/float64(at10), densityCPUTarget)
	}
	return createRatio
}

// reportCPU writes the CPU time the n idle sandboxes cost: the daemon's,
// the machine's against none alive, and the busiest other commands.
func (r *densityIdleReadings) reportCPU(out io.Writer, quietCPU time.Duration, n int) {
	fmt.Fprintf(out, "  daemon CPU time with %d idle sandboxes: %.1f ms per second (over %s)\n",
		n, perSecond(r.idleCPU, densityIdle), densityIdle)
	if quietCPU < 0 || r.machineCPU < 0 {
		return
	}
	busy, share := perSecond(r.machineCPU, densityIdle), ""
	if cpus := machineCPUs(); cpus > 0 {
		// What the creates at n alive no longer have, whatever a
		// create itself costs.
		share = fmt.Sprintf(" (%.0f%% of its %d CPUs)", busy/10/float64(cpus), cpus)
	}
	fmt.Fprintf(out, "  machine CPU time with the %d idle: %.1f ms per second%s, with none %.1f (every process and the kernel's threads, from /proc/stat)\n",
		n, busy, share, perSecond(quietCPU, densityQuiet))
	if r.procs0 != nil && r.procsN != nil {
		// Each process's time is counted to the tick, so over
		// thousands of processes the parts do not add up to the
		// machine's to the millisecond.
		busiest := describeBusiest(byCommand(r.procs0, r.procsN, os.Getpid()), 5, densityIdle)
		fmt.Fprintf(out, "    of which the daemon %.1f; the busiest other commands %s\n",
			perSecond(r.idleCPU, densityIdle), busiest)
	}
}

// reportDensityCosts writes what each of the n idle sandboxes costs the
// daemon (memory, descriptors, goroutines, threads) and the host (its
// threads, and so the kernel's pivot_root).
func reportDensityCosts(out io.Writer, b densityBefore, r *densityIdleReadings, n int) {
	fmt.Fprintf(out, "  daemon resident memory: %.1f MiB more, %.3f MiB per idle sandbox after a GC (%.3f before it; Go heap in use %.1f MiB)\n",
		mib(r.rss-b.rss), mib(r.rss-b.rss)/float64(n), mib(r.rssLive-b.rss)/float64(n), mib(int64(r.mstat.HeapInuse)))
	fmt.Fprintf(out, "  daemon per idle sandbox: %.1f descriptors, %.1f goroutines, %.2f threads\n",
		float64(openFDs()-b.fds)/float64(n), float64(runtime.NumGoroutine()-b.gr)/float64(n), float64(threads()-b.th)/float64(n))
	if b.tasks > 0 && r.tasks > 0 {
		fmt.Fprintf(out, "  threads on the host: %d before, %d with the sandboxes idle (%.1f per sandbox)\n",
			b.tasks, r.tasks, float64(r.tasks-b.tasks)/float64(n))
	}
	if err := errors.Join(b.pivot.Err, r.pivot.Err); err != nil {
		fmt.Fprintf(out, "  the kernel's pivot_root: %v\n", err)
	} else {
		// Part of every start's cost that grows with the threads on the
		// host, whichever runtime starts (kernelPivot).
		fmt.Fprintf(out, "  the kernel's pivot_root with none alive %s, with the %d idle %s (medians of %d; it walks every thread on the host, once per start of fence or runc, twice of bwrap)\n",
			ms(b.pivot.quantile(0.5)), n, ms(r.pivot.quantile(0.5)), pivotRuns)
	}
}

// reportDensityPeer writes, with a peer, how much slower it starts with
// the n idle than with none, and fence's create-rate ratio against it.
func reportDensityPeer(out io.Writer, peer bool, b densityBefore, r *densityIdleReadings, n int, createRatio float64) {
	switch {
	case !peer:
	case b.peer.Err != nil || r.peer.Err != nil:
		fmt.Fprintf(out, "  bwrap /bin/true: failed: %v\n", errors.Join(b.peer.Err, r.peer.Err))
	default:
		// As a rate, comparable with the creates per second above.
		b0, bN := b.peer.quantile(0.5), r.peer.quantile(0.5)
		peerRatio := float64(b0) / float64(bN)
		fmt.Fprintf(out, "  bwrap /bin/true with none alive %s, with the %d idle %s (as a rate, ratio %.2f; medians of %d)\n",
			ms(b0), n, ms(bN), peerRatio, densityPeerRuns)
		if createRatio > 0 {
			// Above 1: the creates slowed down less than the host's own
			// sandbox starts did.
			fmt.Fprintf(out, "  fence's create-rate ratio against bwrap's: %.2f\n", createRatio/peerRatio)
		}
	}
}

// answerAll checks that every sandbox still answers (runs /bin/true).
func answerAll(ctx context.Context, sbs []*client.Sandbox, out io.Writer) error {
	astart := time.Now()
	var (
		mu  sync.Mutex
		bad []string
	)
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
		return fmt.Errorf("density: %d sandboxes did not answer, e.g. %s", len(bad), bad[0])
	}
	return nil
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

// childrenCPU is the CPU time of this process's waited-for children.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// cpuProfiles writes the daemon's CPU profiles over density's windows
// when its prefix is set (FENCE_BENCH_CPU_PROFILE): PREFIX-at10.pprof over
// the creates at 10 alive, PREFIX-atN.pprof over the last ones and
// PREFIX-idle.pprof over the idle window, for `go tool pprof -diff_base`.
type cpuProfiles struct {
	prefix string
	f      *os.File // the profile being written
}

func newCPUProfiles() *cpuProfiles {
	return &cpuProfiles{prefix: os.Getenv("FENCE_BENCH_CPU_PROFILE")}
}

// window starts or stops the profile at the k-th of n creates, at the
// bounds of the windows the CPU time per create is read over.
func (p *cpuProfiles) window(k, n int) {
	switch k {
	case 10:
		p.start("at10")
	case n - densityWindow:
		p.start("atN")
	case 10 + densityWindow, n:
		p.stop()
	}
}

func (p *cpuProfiles) start(name string) {
	if p.prefix == "" || p.f != nil {
		return
	}
	f, err := os.Create(p.prefix + "-" + name + ".pprof")
	if err != nil {
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return
	}
	p.f = f
}

func (p *cpuProfiles) stop() {
	if p.f != nil {
		pprof.StopCPUProfile()
		p.f.Close()
		p.f = nil
	}
}
