// Package selftest runs fence's attack probes (package probe) inside a
// sandbox and judges them, for `fence selftest` and the native backend's
// attack tests.
//
// # What it guarantees
//
//   - Every check of probe.Checks runs, in order, each in its own process
//     started by the sandbox's agent as the sandbox's root (its strongest
//     user), and yields exactly one Result.
//   - A check passes only on positive evidence: the probe printed "ok" and
//     exited 0, or was killed by the signal the check expects. A probe that
//     could not start, could not carry out its attack, timed out or said
//     anything else fails.
//   - Where a failure inside the sandbox could have another cause than
//     fence, the host side adds its own evidence: the host's addresses are
//     attacked on a listener this package opens, which must accept nothing,
//     and, given a FlowLog fed by the sandbox's network stack, each
//     connection and DNS question must have been refused by fence's policy
//     (not merely have failed for want of a route).
//
// It creates no sandbox itself: the caller does, and hands over a way to
// run a command in it (Exec).
package selftest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fencesandbox/fence/internal/selftest/probe"
)

// ProbeCommand is how a probe is started inside a sandbox: the fence
// binary, which the native backend mounts read-only at /.fence/fence, in
// its `probe` role. The check's name and arguments follow.
var ProbeCommand = []string{"/.fence/fence", "probe"}

// ExternalTargets are the outside addresses the egress check connects
// to: public resolvers on both families and the cloud metadata address.
var ExternalTargets = []netip.AddrPort{
	netip.MustParseAddrPort("1.1.1.1:443"),
	netip.MustParseAddrPort("8.8.8.8:53"),
	netip.MustParseAddrPort("169.254.169.254:80"),
	netip.MustParseAddrPort("[2606:4700:4700::1111]:443"),
}

// Outcome is how one probe process ended.
type Outcome struct {
	Stdout, Stderr string
	ExitCode       int
	// Signal is the signal that ended the process; zero if it exited.
	Signal syscall.Signal
}

// Exec runs argv in the sandbox as root and reports how it ended. An error
// means the process could not be run or followed to its end.
type Exec func(ctx context.Context, argv []string) (Outcome, error)

// Options configures Run.
type Options struct {
	// Exec runs a probe in the sandbox. Required.
	Exec Exec
	// MemoryBytes and Pids are the limits the sandbox was created with;
	// the limit checks attack them. Required.
	MemoryBytes, Pids int64
	// HostAddrs are the host addresses to attack. Nil means the addresses
	// of this host's interfaces, loopback and IPv6 link-local excepted
	// (those name the sandbox's own interfaces from inside).
	HostAddrs []netip.Addr
	// Flows, when set, is fed with the sandbox network stack's decisions;
	// the network checks then also require fence's refusal on record.
	Flows *FlowLog
	// CheckTimeout bounds each probe; zero means one minute.
	CheckTimeout time.Duration
	// OnResult, when set, is called with each result as it is judged.
	OnResult func(Result)
}

// Result is the verdict on one check.
type Result struct {
	Name  string `json:"name"`
	Group string `json:"group"`
	Pass  bool   `json:"pass"`
	// Detail is what was seen: on a pass what it proves, on a failure
	// what went wrong.
	Detail string `json:"detail"`
	// Seconds is how long the check took.
	Seconds float64 `json:"seconds"`
}

// String formats r as the line `fence selftest` prints.
func (r Result) String() string {
	verdict := "FAIL"
	if r.Pass {
		verdict = "PASS"
	}
	return verdict + " " + r.Name + " — " + r.Detail
}

// Report is the outcome of a whole run.
type Report struct {
	Results []Result `json:"results"`
	Passed  int      `json:"passed"`
	Failed  int      `json:"failed"`
}

// OK reports whether every check passed (and there was at least one).
func (r Report) OK() bool { return r.Failed == 0 && r.Passed > 0 }

// Summary is the last line of the text report.
func (r Report) Summary() string {
	return fmt.Sprintf("%d passed, %d failed", r.Passed, r.Failed)
}

// WriteText writes one line per check and the summary.
func (r Report) WriteText(w io.Writer) error {
	for _, res := range r.Results {
		if _, err := fmt.Fprintln(w, res); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w, r.Summary())
	return err
}

// WriteJSON writes the report as one JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *Report) add(res Result) {
	r.Results = append(r.Results, res)
	if res.Pass {
		r.Passed++
	} else {
		r.Failed++
	}
}

// Run runs every probe check through opts.Exec and judges it. Its error is
// for what keeps the run from starting (bad options, no host listener);
// failed checks are in the Report.
func Run(ctx context.Context, opts Options) (Report, error) {
	if opts.Exec == nil {
		return Report{}, errors.New("selftest: Exec is required")
	}
	if opts.MemoryBytes <= 0 || opts.Pids <= 0 {
		return Report{}, errors.New("selftest: the sandbox's memory and pids limits are required")
	}
	if opts.CheckTimeout == 0 {
		opts.CheckTimeout = time.Minute
	}
	if opts.HostAddrs == nil {
		opts.HostAddrs = interfaceAddrs()
	}
	host, err := listenHost()
	if err != nil {
		return Report{}, err
	}
	defer host.Close()
	dnsName := randomName()

	var rep Report
	for _, c := range probe.Checks() {
		start := time.Now()
		var res Result
		switch c.Name {
		case "egress":
			res = runNet(ctx, opts, c, ExternalTargets, nil)
		case "egress-host":
			targets := host.targets(opts.HostAddrs)
			if len(targets) == 0 {
				res = pass(c, "nothing to attack: this host has no address but loopback and link-local")
				break
			}
			res = runNet(ctx, opts, c, targets, host)
		case "dns":
			res = runDNS(ctx, opts, c, dnsName)
		case "pids-limit":
			res = runProbe(ctx, opts, c, strconv.FormatInt(opts.Pids, 10))
		case "memory-limit":
			res = runProbe(ctx, opts, c, strconv.FormatInt(opts.MemoryBytes, 10))
		default:
			res = runProbe(ctx, opts, c)
		}
		res.Seconds = time.Since(start).Seconds()
		rep.add(res)
		if opts.OnResult != nil {
			opts.OnResult(res)
		}
	}
	return rep, nil
}

func pass(c probe.Check, why string) Result {
	return Result{Name: c.Name, Group: c.Group, Pass: true, Detail: why}
}

func fail(c probe.Check, format string, args ...any) Result {
	return Result{Name: c.Name, Group: c.Group, Detail: fmt.Sprintf(format, args...)}
}

// runProbe runs check c in the sandbox and judges what it did.
func runProbe(ctx context.Context, opts Options, c probe.Check, args ...string) Result {
	ctx, cancel := context.WithTimeout(ctx, opts.CheckTimeout)
	defer cancel()
	argv := append(append(append([]string(nil), ProbeCommand...), c.Name), args...)
	out, err := opts.Exec(ctx, argv)
	return Judge(c, out, err)
}

// Judge decides check c from the outcome of its probe (err: the probe
// could not be run or followed to its end).
func Judge(c probe.Check, out Outcome, err error) Result {
	if err != nil {
		return fail(c, "the probe did not run to its end: %v", err)
	}
	said := strings.TrimSpace(out.Stdout)
	if line, _, _ := strings.Cut(said, "\n"); strings.HasPrefix(line, "ESCAPE:") || strings.HasPrefix(line, "ERROR:") {
		return fail(c, "%s", line)
	}
	if c.KilledBy != 0 {
		if out.Signal == c.KilledBy {
			return pass(c, c.Proves+" (killed by "+signalName(c.KilledBy)+")")
		}
		return fail(c, "the probe %s, want it killed by %s%s", ended(out), signalName(c.KilledBy), quoted(said, out.Stderr))
	}
	if out.Signal == 0 && out.ExitCode == probe.ExitRefused && said == "ok" {
		return pass(c, c.Proves)
	}
	return fail(c, "the probe %s%s", ended(out), quoted(said, out.Stderr))
}

func ended(out Outcome) string {
	if out.Signal != 0 {
		return "was killed by " + signalName(out.Signal)
	}
	return fmt.Sprintf("exited %d", out.ExitCode)
}

func signalName(s syscall.Signal) string {
	return fmt.Sprintf("%s (SIG%d)", s, int(s))
}

// quoted shows what the probe printed, bounded.
func quoted(stdout, stderr string) string {
	var parts []string
	for _, s := range []struct{ name, text string }{{"stdout", stdout}, {"stderr", stderr}} {
		t := strings.TrimSpace(s.text)
		if t == "" {
			continue
		}
		if len(t) > 300 {
			t = t[:300] + "…"
		}
		parts = append(parts, fmt.Sprintf("%s %q", s.name, t))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// runNet runs a connect check against targets and, when given, checks
// that the host listener saw nothing and that fence refused every flow.
func runNet(ctx context.Context, opts Options, c probe.Check, targets []netip.AddrPort, host *hostListener) Result {
	args := make([]string, len(targets))
	for i, t := range targets {
		args[i] = t.String()
	}
	res := runProbe(ctx, opts, c, args...)
	if !res.Pass {
		return res
	}
	if host != nil {
		if n := host.drain(); n > 0 {
			return fail(c, "the host listener on port %d accepted %d connection(s) from the sandbox", host.port, n)
		}
	}
	if opts.Flows == nil {
		return res
	}
	var reasons []string
	for _, t := range targets {
		flows := opts.Flows.await(ctx, func(f Flow) bool { return f.Proto == "tcp" && unmap(f.Dst) == unmap(t) })
		if len(flows) == 0 {
			return fail(c, "the connection to %s failed, but fence recorded no decision on it: it failed elsewhere, which proves nothing", t)
		}
		for _, f := range flows {
			if f.Allowed || f.Reason == dialFailed {
				return fail(c, "fence's policy let the flow to %s through (reason %q)", t, f.Reason)
			}
		}
		reasons = appendNew(reasons, flows[0].Reason)
	}
	return pass(c, fmt.Sprintf("%s (refused by fence: %s)", c.Proves, strings.Join(reasons, ", ")))
}

// dialFailed is the reason the network stack gives a flow its policy
// allowed but whose upstream could not be dialed.
const dialFailed = "dial-failed"

func runDNS(ctx context.Context, opts Options, c probe.Check, name string) Result {
	res := runProbe(ctx, opts, c, name)
	if !res.Pass || opts.Flows == nil {
		return res
	}
	want := strings.TrimSuffix(name, ".")
	flows := opts.Flows.await(ctx, func(f Flow) bool {
		return f.Proto == "dns" && strings.EqualFold(strings.TrimSuffix(f.Name, "."), want)
	})
	if len(flows) == 0 {
		return fail(c, "the lookup of %s failed, but the sandbox's resolver recorded no question for it: it failed elsewhere, which proves nothing", name)
	}
	var reasons []string
	for _, f := range flows {
		if f.Allowed {
			return fail(c, "the sandbox's resolver allowed %s (reason %q)", name, f.Reason)
		}
		reasons = appendNew(reasons, f.Reason)
	}
	return pass(c, fmt.Sprintf("%s (%s refused by fence's resolver: %s)", c.Proves, name, strings.Join(reasons, ", ")))
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

func appendNew(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

// randomName is a DNS name nobody has asked for before.
func randomName() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "fence-selftest-" + hex.EncodeToString(b) + ".example.com."
}

// hostListener is a TCP listener on every host address that counts the
// connections that reached it.
type hostListener struct {
	ln       *net.TCPListener
	port     uint16
	accepted int64
}

func listenHost() (*hostListener, error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return nil, fmt.Errorf("selftest: opening the host listener the sandbox is set on: %w", err)
	}
	return &hostListener{ln: ln.(*net.TCPListener), port: uint16(ln.Addr().(*net.TCPAddr).Port)}, nil
}

// drain accepts every connection waiting in the listener's backlog and
// returns how many have reached it so far. A connection that succeeded
// from the sandbox completed its handshake, so it is in the backlog by the
// time the probe has answered: accepting here, after the probe, cannot
// miss it the way a goroutine accepting on its own time could.
func (h *hostListener) drain() int64 {
	for {
		h.ln.SetDeadline(time.Now().Add(100 * time.Millisecond))
		c, err := h.ln.Accept()
		if err != nil {
			return h.accepted
		}
		h.accepted++
		c.Close()
	}
}

func (h *hostListener) Close() error { return h.ln.Close() }

func (h *hostListener) targets(addrs []netip.Addr) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range addrs {
		out = append(out, netip.AddrPortFrom(a, h.port))
	}
	return out
}

// interfaceAddrs returns this host's addresses that a sandbox could name:
// not loopback (the sandbox's own) and not IPv6 link-local (which needs a
// zone of the sandbox's interfaces).
func interfaceAddrs() []netip.Addr {
	addrs, _ := net.InterfaceAddrs()
	out := []netip.Addr{}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap()
		if ip.IsLoopback() || (ip.Is6() && ip.IsLinkLocalUnicast()) {
			continue
		}
		out = append(out, ip)
	}
	return out
}
