// Package netfence gives a sandbox its network fence, the same on every
// isolation backend: a TUN device in the sandbox's network namespace is
// the namespace's only way out, and a user-space stack in the daemon
// (internal/egress) terminates its packets and decides on each flow.
//
// The fence is its owner's (the daemon's network side,
// internal/sandbox/fences), not the isolation backend's: the owner keeps
// one Net per sandbox (Fence.New), with the sandbox's current policy and
// egress proxy, and hands it to the backend as the sandbox's
// isolation.Network. The backend makes (or is handed) the
// sandbox's network namespace and attaches it; everything past the
// namespace (addresses, resolver, policy, gateway, flow records,
// bandwidth) is the Fence's, set once by the owner. The native backend
// attaches the namespace of its init process; the gvisor backend attaches
// a namespace it makes for runsc, whose sandbox adopts the TUN into
// gVisor's own network stack, once per run (a resume attaches anew).
//
// # Guarantees
//
//   - Attach either returns a running stack that owns the TUN fd (closing
//     the stack removes the device), or an error after closing what it
//     made.
//   - A nil policy denies everything; a Net made with none denies
//     everything until its owner sets one.
//   - A Net's policy and proxy apply to every namespace attached to it,
//     from their next flow on, and to those attached later.
package netfence

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/egress/tun"
)

// Fence is the egress configuration every sandbox of a backend shares.
// Zero fields take the defaults WithDefaults documents.
type Fence struct {
	// DNSUpstream is the "ip:port" of the resolver the sandboxes' DNS
	// answers come from. Empty means the first nameserver of the host's
	// /etc/resolv.conf.
	DNSUpstream string
	// HostAddrs are the host's own addresses, which no sandbox may reach
	// whatever its policy. Nil means the addresses of every interface.
	HostAddrs []netip.Addr
	// Bandwidth bounds each sandbox's traffic in bytes per second per
	// direction; zero means no limit.
	Bandwidth int64
	// Recorder receives one event per flow. Nil logs them at debug level.
	Recorder egress.Recorder
	// Net is what the stacks share (memory budget, DNS cache). Nil means
	// one with the defaults.
	Net *egress.Shared
	// Interceptor, if set, gives each sandbox's stack its egress gateway.
	Interceptor func(id string) egress.Interceptor
	// Ask, if set, gives each sandbox's stack its egress.Options.Ask.
	Ask func(id string) func(ctx context.Context, name string) egress.Approval
	// Admit, if set, gives each sandbox's stack its egress.Options.Admit.
	Admit func(id string) func() string
	// Logger; nil discards.
	Logger *slog.Logger
}

// WithDefaults returns f with its zero fields filled in.
func (f Fence) WithDefaults() Fence {
	if f.Logger == nil {
		f.Logger = slog.New(slog.DiscardHandler)
	}
	if f.DNSUpstream == "" {
		f.DNSUpstream = HostResolver()
	}
	if f.HostAddrs == nil {
		f.HostAddrs = HostAddrs()
	}
	if f.Recorder == nil {
		f.Recorder = logRecorder{f.Logger}
	}
	if f.Net == nil {
		f.Net = egress.NewShared(egress.SharedOptions{})
	}
	return f
}

// DenyAll is the policy of a sandbox that was given none.
var DenyAll = func() *policy.Policy {
	p, err := policy.Compile(policy.Spec{})
	if err != nil {
		panic(err)
	}
	return p
}()

// Attach creates the sandbox's TUN device in the network namespace nsPath
// (configured with egress.SandboxIPv4 and egress.SandboxIPv6, and a default
// route through it) and starts the daemon-side stack behind it with policy
// pol. The stack lives until closed, not until ctx ends.
//
// kernelPeer says the sandbox's own Linux kernel reads and writes the
// device (the native backend). The device then carries virtio-net headers
// (tun.Config.VnetHdr): the stack hands the kernel TCP and UDP packets with
// partial checksums instead of summing every byte, and verifies the
// checksums of every packet it reads (the kernel computes them all).
// Without it (runsc reads and writes the device through a packet socket,
// finds partial checksums unfinished, and leaves its own out as its link
// offloads them), the stack sends complete checksums and takes the ones it
// reads as they are.
func (f *Fence) Attach(ctx context.Context, id, nsPath string, kernelPeer bool, pol *policy.Policy) (*egress.Stack, error) {
	if pol == nil {
		pol = DenyAll
	}
	fd, err := tun.Create(nsPath, tun.Config{Addr: []netip.Prefix{egress.SandboxIPv4, egress.SandboxIPv6}, VnetHdr: kernelPeer})
	if err != nil {
		return nil, fmt.Errorf("creating sandbox network device: %w", err)
	}
	var icpt egress.Interceptor
	if f.Interceptor != nil {
		icpt = f.Interceptor(id)
	}
	var ask func(context.Context, string) egress.Approval
	if f.Ask != nil {
		ask = f.Ask(id)
	}
	var admit func() string
	if f.Admit != nil {
		admit = f.Admit(id)
	}
	st, err := egress.New(context.WithoutCancel(ctx), egress.Options{
		Ask:         ask,
		Admit:       admit,
		SandboxID:   id,
		FD:          fd,
		Policy:      pol,
		DNSUpstream: f.DNSUpstream,
		HostAddrs:   f.HostAddrs,
		Recorder:    f.Recorder,
		Shared:      f.Net,
		Interceptor: icpt,
		Bandwidth:   f.Bandwidth,
		Logger:      f.Logger,
		// runsc's stack leaves its checksums out (see kernelPeer).
		TrustChecksums: !kernelPeer,
	})
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("starting sandbox network: %w", err)
	}
	return st, nil
}

// NewNetNS makes a new, empty network namespace and returns an fd of it
// (close-on-exec), which keeps it alive: "/proc/self/fd/N" names it for
// Attach, and /proc/<pid>/fd/N for another process. No process needs to
// live in it.
func NewNetNS() (*os.File, error) {
	errc := make(chan error, 1)
	fc := make(chan *os.File, 1)
	// The thread that unshares is not returned to the runtime: it exits
	// with the goroutine, so no other goroutine ever runs in the new
	// namespace.
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("creating network namespace: %w", err)
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("opening network namespace: %w", err)
			return
		}
		fc <- os.NewFile(uintptr(fd), "netns")
	}()
	select {
	case err := <-errc:
		return nil, err
	case f := <-fc:
		return f, nil
	}
}

// HostResolver returns the first nameserver of /etc/resolv.conf as
// "ip:53", or 127.0.0.53:53 when there is none.
func HostResolver() string {
	b, _ := os.ReadFile("/etc/resolv.conf")
	for _, line := range strings.Split(string(b), "\n") {
		fl := strings.Fields(line)
		if len(fl) >= 2 && fl[0] == "nameserver" {
			if a, err := netip.ParseAddr(fl[1]); err == nil {
				return netip.AddrPortFrom(a.WithZone(""), 53).String()
			}
		}
	}
	return "127.0.0.53:53"
}

// HostAddrs returns the addresses of the host's interfaces.
func HostAddrs() []netip.Addr {
	var out []netip.Addr
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

// LogRecorder returns a recorder that logs flow events at debug level,
// for a backend used without the audit log.
func LogRecorder(log *slog.Logger) egress.Recorder { return logRecorder{log} }

// logRecorder logs flow events; the audit log replaces it.
type logRecorder struct{ log *slog.Logger }

func (r logRecorder) Record(ctx context.Context, ev egress.FlowEvent) {
	r.log.DebugContext(ctx, "network flow", "sandbox_id", ev.SandboxID, "proto", ev.Proto,
		"dst", ev.Dst, "name", ev.Name, "observed", ev.Observed, "allowed", ev.Allowed, "reason", ev.Reason,
		"bytes_out", ev.BytesOut, "bytes_in", ev.BytesIn)
}
