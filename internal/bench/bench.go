// Package bench measures fence against its peers on this machine, in one
// run: create → exec `true` → kill, and exec in a running sandbox, for fence
// and side by side for bwrap and runc running the same `true` in the same
// root filesystem, plus the memory an idle sandbox costs.
//
// It reports figures; it asserts nothing. Peers that are not installed are
// reported as missing rather than failing the run.
package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/netfence"
)

// Options configures a run.
type Options struct {
	// Backend creates the fence sandboxes (deny-all unless a measure says
	// otherwise: the backend's Options.Network). Required.
	Backend isolation.Backend
	// Fence is Backend's network fence, whose Nets the network measure
	// gives its sandbox (with the policy it needs). Required for NetBytes.
	Fence *netfence.Fence
	// RootFS is the template root used by fence and by the peers. Required.
	RootFS string
	// Iterations per measure; zero means 50.
	Iterations int
	// Idle is how many idle sandboxes to hold for the memory figure; zero
	// means 20.
	Idle int
	// Peers enables the bwrap and runc measures.
	Peers bool
	// WorkDir holds the peers' scratch state; empty means a temp dir.
	WorkDir string
	// Daemon, when set, starts a fence daemon for the measures through the
	// API: the SDK-shaped round trip and the density run.
	Daemon DaemonStarter
	// Templates names the templates of the API round trip (RootFS's
	// template first).
	Templates []string
	// Density, when above zero, is how many idle sandboxes the density run
	// creates (needs Daemon).
	Density int
	// NetBytes, when above zero, is the size of the network measure's bulk
	// download (needs iproute2).
	NetBytes int64
	// DNSServer, when set, is the benchmark's DNS server (StartDNS), the
	// upstream of Backend: the network measure then times DNS lookups.
	DNSServer string
}

// Result is one measure.
type Result struct {
	Name    string
	Samples []time.Duration
	Err     error
	peer    bool   // a peer runtime's measure, not fence's
	note    string // printed after the name (not part of it)
}

func (r Result) quantile(q float64) time.Duration {
	if len(r.Samples) == 0 {
		return 0
	}
	s := slices.Clone(r.Samples)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// Run runs every measure and writes a report to out.
func Run(ctx context.Context, opts Options, out io.Writer) error {
	if opts.Backend == nil || opts.RootFS == "" {
		return errors.New("bench: Backend and RootFS are required")
	}
	if opts.Iterations <= 0 {
		opts.Iterations = 50
	}
	if opts.Idle <= 0 {
		opts.Idle = 20
	}
	if opts.WorkDir == "" {
		d, err := os.MkdirTemp("", "fence-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		opts.WorkDir = d
	}
	fmt.Fprintf(out, "fence bench: %d iterations, rootfs %s\n", opts.Iterations, opts.RootFS)
	results, teardown, steps := coldCycle(ctx, opts)
	results = append(results, fenceWarm(ctx, opts))
	execs := fenceExec(ctx, opts)
	results = append(results, execs[0])
	results = append(results, fencePause(ctx, opts)...)
	if opts.Peers {
		results = append(results, peers(ctx, opts, out)...)
		results = append(results, execs[1:]...)
	}
	// The idle memory is read before the API measures start daemons in
	// this process.
	perSandbox, daemonSide, idleErr := idleMemory(ctx, opts)
	roundTrips, daemonRan := apiRoundTrips(ctx, opts, out)
	results = append(results, roundTrips...)
	writeTable(out, results)
	fmt.Fprint(out, teardown)
	fmt.Fprint(out, steps)
	writeRatios(out, results)
	if idleErr != nil {
		fmt.Fprintf(out, "idle sandbox memory: failed: %v\n", idleErr)
	} else {
		fmt.Fprintf(out, "idle sandbox memory, mean of %d: %.2f MiB in its cgroups + %.2f MiB in the backend (network stack, bookkeeping) = %.2f MiB\n",
			opts.Idle, mib(perSandbox), mib(daemonSide), mib(perSandbox+daemonSide))
	}
	var errs []error
	if opts.NetBytes > 0 {
		if err := measureNet(ctx, opts, out); err != nil {
			fmt.Fprintf(out, "network: failed: %v\n", err)
			errs = append(errs, fmt.Errorf("network: %w", err))
		}
	}
	// Everything is reported; then fence's own failures fail the run (a
	// peer that is missing or fails does not).
	for _, r := range results {
		if r.Err != nil && !r.peer {
			errs = append(errs, fmt.Errorf("%s: %w", strings.TrimSpace(r.Name), r.Err))
		}
	}
	if idleErr != nil {
		errs = append(errs, fmt.Errorf("idle sandbox memory: %w", idleErr))
	}
	if daemonRan && opts.Density > 0 {
		if err := runDensity(ctx, opts, out); err != nil {
			fmt.Fprintf(out, "density: failed: %v\n", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// coldCycle measures fence's cold cycle (create, exec true, kill) and its
// phases, and describes the teardown of its sandboxes after kill answered
// and the steps of their creates when the backend times them ("" otherwise).
func coldCycle(ctx context.Context, opts Options) (results []Result, teardown, steps string) {
	var phases coldPhases
	rt, _ := opts.Backend.(releaseTimer)
	var rt0 native.ReleaseTimes
	if rt != nil {
		rt0 = rt.ReleaseTimes()
	}
	tracer, _ := opts.Backend.(createTracer)
	if tracer != nil {
		tracer.TraceCreates(true)
	}
	cold := measure("fence create→exec true→kill", opts.Iterations, func(i int) error {
		return fenceCold(ctx, opts.Backend, opts.RootFS, &phases, i)
	})
	if tracer != nil {
		var b strings.Builder
		writeCreateSteps(&b, tracer.CreateTraces())
		steps = b.String()
		tracer.TraceCreates(false)
	}
	if rt != nil && cold.Err == nil {
		t := rt.ReleaseTimes()
		if n := t.N - rt0.N; n > 0 {
			per := func(a, b time.Duration) string { return ms((a - b) / time.Duration(n)) }
			teardown = fmt.Sprintf("teardown of a cold cycle's sandbox (after kill answered), mean of %d: exits and the kernel's namespace teardown %s, cgroup removal %s, layer archive %s, layer, socket and state release %s\n",
				n, per(t.Exit, rt0.Exit), per(t.Cgroup, rt0.Cgroup), per(t.Archive, rt0.Archive), per(t.Rest, rt0.Rest))
		}
	}
	if cold.Err == nil {
		cold.Samples = phases.cycle()
	}
	results = append(results, cold)
	results = append(results, phases.results()...)
	return results, teardown, steps
}

// peers measures the peer runtimes' one-shot runs: bwrap, runc, and runsc
// when it is installed.
func peers(ctx context.Context, opts Options, out io.Writer) []Result {
	results := []Result{measure("bwrap /bin/true", opts.Iterations, func(int) error {
		return bwrapTrue(ctx, opts)
	})}
	results = append(results, runcMeasure(ctx, opts))
	if runsc := runscBinary(); runsc != "" {
		results = append(results, runscMeasure(ctx, opts, runsc))
	} else {
		fmt.Fprintf(out, "runsc: not installed (%s, FENCE_RUNSC or PATH), skipped\n", RunscPath)
	}
	for i := range results {
		results[i].peer = true
	}
	return results
}

// apiRoundTrips measures the SDK round trip of every template through a
// daemon (with a warm pool of 2 for its default template), then again
// those it measured cold from a warm pool of their own; ran reports that
// the daemon started.
func apiRoundTrips(ctx context.Context, opts Options, out io.Writer) (results []Result, ran bool) {
	if opts.Daemon == nil {
		return nil, false
	}
	d, err := opts.Daemon(ctx, 2)
	if err != nil {
		return []Result{{Name: "api round trip", Err: err}}, false
	}
	var cold []string
	for _, t := range opts.Templates {
		results = append(results, sdkRoundTrip(ctx, d, t, opts.Iterations)...)
		if !slices.Contains(d.Pooled, t) {
			cold = append(cold, t)
		}
	}
	results = append(results, apiExec(ctx, d, opts.RootFS, opts.Templates[0], opts.Iterations, opts.Peers)...)
	explainAll(d, results)
	if err := d.Stop(); err != nil {
		fmt.Fprintf(out, "stopping the benchmark daemon: %v\n", err)
	}
	// The templates measured cold, again from a warm pool of
	// their own, as `fence serve --warm-template NAME=2` keeps.
	if len(cold) > 0 {
		if d, err := opts.Daemon(ctx, 2, cold...); err != nil {
			results = append(results, Result{Name: "api round trip, warm templates", Err: err})
		} else {
			var warm []Result
			for _, t := range cold {
				warm = append(warm, sdkRoundTrip(ctx, d, t, opts.Iterations)...)
			}
			explainAll(d, warm)
			results = append(results, warm...)
			if err := d.Stop(); err != nil {
				fmt.Fprintf(out, "stopping the benchmark daemon: %v\n", err)
			}
		}
	}
	return results, true
}

// writeTable prints every result with its ratio to bwrap's one-shot run,
// the reference peer, when it ran; otherwise to fence's cold cycle.
func writeTable(out io.Writer, results []Result) {
	ref, refName := Result{}, ""
	for _, r := range results {
		if r.Name == "bwrap /bin/true" && r.Err == nil {
			ref, refName = r, "bwrap"
		}
	}
	if refName == "" && len(results) > 0 && results[0].Err == nil {
		ref, refName = results[0], "fence cold"
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "measure\tmedian\tp99\tvs %s (median)\n", refName)
	for _, r := range results {
		if r.Err != nil {
			// Its first line: the rest (what a failure saw) follows the
			// table, with the run's errors.
			first, _, _ := strings.Cut(r.Err.Error(), "\n")
			fmt.Fprintf(w, "%s\tfailed: %s\t\t\n", r.Name, first)
			continue
		}
		ratio := "-"
		if c := ref.quantile(0.5); c > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(r.quantile(0.5))/float64(c))
		}
		name := r.Name
		if r.note != "" {
			name += " (" + r.note + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", name, ms(r.quantile(0.5)), ms(r.quantile(0.99)), ratio)
	}
	w.Flush()
}

// runDensity runs the density measure on a daemon of its own, without a
// warm pool (pooled sandboxes would be counted as idle ones).
func runDensity(ctx context.Context, opts Options, out io.Writer) error {
	d, err := opts.Daemon(ctx, 0)
	if err != nil {
		return err
	}
	var peer func(context.Context) error
	if opts.Peers {
		peer = func(ctx context.Context) error { return bwrapTrue(ctx, opts) }
	}
	err = density(ctx, d, opts.Templates[0], opts.Density, peer, out)
	return errors.Join(d.explain(err), d.Stop())
}

// explainAll adds the daemon's reason to the failures of results (fence's
// own: a peer's failure is not the daemon's).
func explainAll(d *Daemon, results []Result) {
	for i := range results {
		if !results[i].peer {
			results[i].Err = d.explain(results[i].Err)
		}
	}
}

// bwrapTrue runs /bin/true in bwrap, on the same root filesystem.
func bwrapTrue(ctx context.Context, opts Options) error {
	return run(ctx, "bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", opts.RootFS, "/",
		"--proc", "/proc", "--dev", "/dev", "/bin/true")
}

// median is the median of ds (zero for none).
func median(ds []time.Duration) time.Duration {
	return Result{Samples: ds}.quantile(0.5)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func measure(name string, n int, f func(i int) error) Result {
	r := Result{Name: name}
	if err := f(-1); err != nil { // warm-up
		r.Err = err
		return r
	}
	for i := range n {
		start := time.Now()
		if err := f(i); err != nil {
			r.Err = err
			return r
		}
		r.Samples = append(r.Samples, time.Since(start))
	}
	return r
}

func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

var seq int

func newID(prefix string) string {
	seq++
	return prefix + strconv.Itoa(os.Getpid()) + "x" + strconv.Itoa(seq)
}

// coldPhases splits the cold cycle into its phases. The teardown is the
// release of the killed sandbox's host resources, after Kill has answered
// (off the request path), timed when the backend can report it.
//
// execCPU is the sandbox's CPU time (its cgroup's: the agent and the
// command) in each exec phase, read outside the phases: beside the wall
// time, which follows the machine's load and what runs beside the first
// exec, the work of the first exec itself.
type coldPhases struct{ create, exec, kill, teardown, execCPU []time.Duration }

func (p *coldPhases) results() []Result {
	exec := Result{Name: "  phase: exec true", Samples: p.exec}
	if len(p.execCPU) > 0 {
		exec.note = "sandbox CPU " + ms(median(p.execCPU))
	}
	r := []Result{
		{Name: "  phase: create", Samples: p.create},
		exec,
		{Name: "  phase: kill", Samples: p.kill},
	}
	if len(p.teardown) > 0 {
		r = append(r, Result{Name: "  phase: teardown (after kill answered)", Samples: p.teardown})
	}
	return r
}

// cycle returns the samples of the whole cycle, create to kill answered
// (the teardown after it is not part of it).
func (p *coldPhases) cycle() []time.Duration {
	s := make([]time.Duration, len(p.create))
	for i := range s {
		s[i] = p.create[i] + p.exec[i] + p.kill[i]
	}
	return s
}

// releaseTimer is a backend that sums the steps of its teardowns (the
// native backend).
type releaseTimer interface {
	ReleaseTimes() native.ReleaseTimes
}

// releaseWaiter is a backend that can wait for the teardown its kills
// leave behind (the native backend).
type releaseWaiter interface {
	WaitReleased(ctx context.Context) error
}

func fenceCold(ctx context.Context, b isolation.Backend, rootfs string, p *coldPhases, i int) error {
	t0 := time.Now()
	sb, err := b.Create(ctx, isolation.Spec{ID: newID("bench"), RootFS: rootfs})
	if err != nil {
		return err
	}
	t1 := time.Now()
	// The sandbox's CPU is read before and after the exec phase, outside
	// every phase.
	st0, serr := sb.Stats(ctx)
	t1s := time.Now()
	err = execTrue(ctx, processClient(sb))
	t2 := time.Now()
	st1, serr1 := sb.Stats(ctx)
	t2s := time.Now()
	if kerr := sb.Kill(context.WithoutCancel(ctx)); err == nil {
		err = kerr
	}
	t3 := time.Now()
	// Each cycle starts with the previous one's teardown done, so that
	// the phases do not include it; the API round trips below do overlap
	// it, as a client's back-to-back sandboxes do.
	if w, ok := b.(releaseWaiter); ok && err == nil {
		err = w.WaitReleased(ctx)
	}
	if i >= 0 && err == nil {
		p.create = append(p.create, t1.Sub(t0))
		p.exec = append(p.exec, t2.Sub(t1s))
		p.kill = append(p.kill, t3.Sub(t2s))
		if serr == nil && serr1 == nil {
			p.execCPU = append(p.execCPU, st1.CPUUsage-st0.CPUUsage)
		}
		if _, ok := b.(releaseWaiter); ok {
			p.teardown = append(p.teardown, time.Since(t3))
		}
	}
	return err
}

// fenceExec measures an exec in a running sandbox and, with peers, the
// host's fork+exec of the same kind, their samples alternated: the
// earlier measures leave teardown and refills behind them in the
// background, and a ratio of two measures taken minutes apart would
// carry whatever the machine did in between.
func fenceExec(ctx context.Context, opts Options) []Result {
	name := "fence exec true in a running sandbox"
	sb, err := opts.Backend.Create(ctx, isolation.Spec{ID: newID("benchexec"), RootFS: opts.RootFS})
	if err != nil {
		return []Result{{Name: name, Err: err}}
	}
	defer sb.Kill(context.WithoutCancel(ctx))
	if w, ok := opts.Backend.(releaseWaiter); ok {
		if err := w.WaitReleased(ctx); err != nil {
			return []Result{{Name: name, Err: err}}
		}
	}
	c := processClient(sb)
	fence := Result{Name: name}
	host := Result{Name: baselineName, peer: true}
	// The CPU time each side spends per exec, beside the wall time: on a
	// busy machine the wall time follows the neighbours, the CPU time
	// less. The sandbox's is its cgroup's (the agent and the command), the
	// host's that of this process's children (the command).
	var sandboxCPU, hostCPU time.Duration
	for i := -1; i < opts.Iterations; i++ { // -1: warm-up
		st0, _ := sb.Stats(ctx)
		start := time.Now()
		if err := execTrue(ctx, c); err != nil {
			fence.Err = err
			return []Result{fence}
		}
		if i >= 0 {
			fence.Samples = append(fence.Samples, time.Since(start))
			if st1, err := sb.Stats(ctx); err == nil {
				sandboxCPU += st1.CPUUsage - st0.CPUUsage
			}
		}
		if !opts.Peers {
			continue
		}
		c0 := childrenCPU()
		start = time.Now()
		if err := hostTrue(ctx, opts.RootFS); err != nil {
			host.Err = err
			return []Result{fence, host}
		}
		if i >= 0 {
			host.Samples = append(host.Samples, time.Since(start))
			hostCPU += childrenCPU() - c0
		}
	}
	if n := time.Duration(opts.Iterations); n > 0 {
		fence.note = "sandbox CPU " + ms(sandboxCPU/n) + " per exec"
		if opts.Peers {
			host.note = "children's CPU " + ms(hostCPU/n) + " per exec"
		}
	}
	if !opts.Peers {
		return []Result{fence}
	}
	return []Result{fence, host}
}

// pauseFillMiB is the memory a sandbox holds while its pause and resume
// are timed: a pause freezes its processes and keeps their memory where it
// is, so the figure shows whether the cost grows with the memory in use.
const pauseFillMiB = 100

// pauseFill starts, in a sandbox, a shell that holds pauseFillMiB in a
// variable until it is killed, and returns (printing the shell's pid in
// the sandbox) once the variable is set, or exits 1 after a minute
// without. The ":" after the sleep keeps the shell from exec'ing its last
// command in place of itself, as busybox's sh and dash do, which would
// drop the variable and its memory the moment it was filled.
var pauseFill = fmt.Sprintf(`rm -f /tmp/.fence-filled; `+
	`(x=$(head -c %d /dev/zero | tr '\000' a); : >/tmp/.fence-filled; sleep 3600; :) </dev/null >/dev/null 2>&1 & echo $!; `+
	`i=0; while [ ! -e /tmp/.fence-filled ]; do [ $i -lt 600 ] || exit 1; sleep 0.1; i=$((i+1)); done`, pauseFillMiB<<20)

// holdsFill fails unless sb's cgroups hold at least pauseFillMiB, with
// what they hold (a few readings: the kernel's count may trail a moment).
// pid is the filling shell's in the sandbox.
func holdsFill(ctx context.Context, sb isolation.Sandbox, pid []byte, when string) error {
	var inUse int64
	for i := range 20 {
		if i > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		st, err := sb.Stats(ctx)
		if err != nil {
			return err
		}
		if inUse = st.MemoryBytes; inUse >= pauseFillMiB<<20 {
			return nil
		}
	}
	return fmt.Errorf("the sandbox holds %.0f MiB %s, want %d (the filling shell is pid %s in the sandbox)\n%s",
		mib(inUse), when, pauseFillMiB, bytes.TrimSpace(pid), describeSandbox(ctx, sb))
}

// fencePause measures pausing and resuming (isolation.Pauser) a sandbox
// whose shell holds pauseFillMiB in a variable (pauseFill), and checks
// that it still does after them.
func fencePause(ctx context.Context, opts Options) []Result {
	name := fmt.Sprintf("fence pause (%d MiB in use)", pauseFillMiB)
	fail := func(err error) []Result { return []Result{{Name: name, Err: err}} }
	sb, err := opts.Backend.Create(ctx, isolation.Spec{ID: newID("benchpause"), RootFS: opts.RootFS})
	if err != nil {
		return fail(err)
	}
	defer sb.Kill(context.WithoutCancel(ctx))
	p, ok := isolation.As[isolation.Pauser](sb)
	if !ok {
		return fail(fmt.Errorf("the %s backend cannot pause", opts.Backend.Name()))
	}
	pid, err := runAsRoot(ctx, processClient(sb), "sh", "-c", pauseFill)
	if err != nil {
		return fail(fmt.Errorf("filling the sandbox's memory: %w\n%s", err, describeSandbox(ctx, sb)))
	}
	if err := holdsFill(ctx, sb, pid, "once filled"); err != nil {
		return fail(err)
	}
	var resumes []time.Duration
	pause := measure(name, opts.Iterations, func(int) error {
		if err := p.Pause(ctx); err != nil {
			return err
		}
		start := time.Now()
		err := p.Resume(ctx)
		resumes = append(resumes, time.Since(start))
		return err
	})
	if pause.Err == nil {
		// The figures are of a sandbox that held the memory throughout.
		pause.Err = holdsFill(ctx, sb, pid, "after its pauses and resumes")
	}
	// measure timed pause+resume; split them.
	resume := Result{Name: fmt.Sprintf("fence resume (%d MiB in use)", pauseFillMiB), Err: pause.Err}
	if pause.Err == nil {
		resumes = resumes[1:] // the warm-up's
		resume.Samples = resumes
		for i := range pause.Samples {
			pause.Samples[i] -= resumes[i]
		}
	}
	return []Result{pause, resume}
}

// cgroupDescriber is a sandbox that reports what its cgroups hold (the
// native backend's).
type cgroupDescriber interface{ DescribeCgroups() string }

// describeSandbox reports, for a measure that failed on what a sandbox
// holds, what its cgroups hold on the host and what its processes are
// from inside.
func describeSandbox(ctx context.Context, sb isolation.Sandbox) string {
	var b strings.Builder
	if d, ok := isolation.As[cgroupDescriber](sb); ok {
		b.WriteString(d.DescribeCgroups())
	}
	ps, err := runAsRoot(ctx, processClient(sb), "ps", "-o", "pid,ppid,stat,rss,vsz,args")
	if err != nil {
		fmt.Fprintf(&b, "ps in the sandbox: %v\n", err)
	} else {
		fmt.Fprintf(&b, "ps in the sandbox:\n%s", ps)
	}
	return b.String()
}

// processClient speaks to a sandbox's agent the way the daemon's proxy
// does: Connect over HTTP/1.1 on a fresh agent connection.
func processClient(sb isolation.Sandbox) processconnect.ProcessClient {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.DialAgent(ctx) },
	}}
	return processconnect.NewProcessClient(hc, "http://agent", connect.WithProtoJSON())
}

func execTrue(ctx context.Context, c processconnect.ProcessClient) error {
	_, err := runAsRoot(ctx, c, "/bin/true")
	return err
}

// runAsRoot runs cmd in a sandbox as its root through the agent, and
// returns its standard output once it has exited 0.
func runAsRoot(ctx context.Context, c processconnect.ProcessClient, cmd string, args ...string) ([]byte, error) {
	stdin := false
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: cmd, Args: args},
		Stdin:   &stdin,
	})
	req.Header().Set("Authorization", "Basic cm9vdDo=") // root
	stream, err := c.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var stdout, stderr bytes.Buffer
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			stdout.Write(d.GetStdout())
			stderr.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			// Read to the stream's end, as the SDKs do: its connection
			// to the agent is then reused (closing the stream at the end
			// event dropped it, and every exec paid a new one).
			for stream.Receive() {
			}
			if end.GetExitCode() != 0 {
				return nil, fmt.Errorf("%s exited %d: %s", cmd, end.GetExitCode(), bytes.TrimSpace(stderr.Bytes()))
			}
			return stdout.Bytes(), nil
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("stream ended without an end event")
}

// ratioGoals are fence's targets against its peers: a fence measure, the
// peer it is compared with, and the most the ratio of their medians should
// be (zero: no target, reported only).
var ratioGoals = []struct {
	measure, peer string
	goal          float64
}{
	{"fence create→exec true→kill", "bwrap /bin/true", 2},
	{"fence create→exec true→kill, warm pool", "bwrap /bin/true", 1},
	{"fence exec true in a running sandbox", "baseline fork+exec /bin/true", 1.2},
	{"api exec true in a running sandbox", "baseline fork+exec /bin/true (beside the api exec)", 0},
	{"api create→run echo→kill, minimal", "bwrap /bin/true", 2.5},
	{"api create→run echo→kill, minimal (warm pool)", "bwrap /bin/true", 2.5},
	{"api create→run echo→kill, base", "bwrap /bin/true", 4},
	{"api create→run echo→kill, base (warm pool)", "bwrap /bin/true", 4},
	{"fence create→exec true→kill", "runc run /bin/true", 0},
	{"fence create→exec true→kill", "runsc run /bin/true", 0},
}

// writeRatios prints, for every measure and peer that both ran, the ratio
// of their medians in this run and whether it meets fence's target.
func writeRatios(out io.Writer, results []Result) {
	byName := map[string]Result{}
	for _, r := range results {
		if r.Err == nil && len(r.Samples) > 0 {
			byName[r.Name] = r
		}
	}
	var lines []string
	for _, g := range ratioGoals {
		m, ok1 := byName[g.measure]
		p, ok2 := byName[g.peer]
		if !ok1 || !ok2 || p.quantile(0.5) <= 0 {
			continue
		}
		ratio := float64(m.quantile(0.5)) / float64(p.quantile(0.5))
		line := fmt.Sprintf("  %s / %s: %.2fx", g.measure, g.peer, ratio)
		if g.goal > 0 {
			verdict := "met"
			if ratio > g.goal {
				verdict = "not met"
			}
			line += fmt.Sprintf(" (target ≤ %.1fx: %s)", g.goal, verdict)
		}
		lines = append(lines, line)
	}
	if len(lines) > 0 {
		fmt.Fprintf(out, "ratios in this run (medians):\n%s\n", strings.Join(lines, "\n"))
	}
}
