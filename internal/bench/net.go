package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"

	mdns "github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/boot"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/insandbox/netclient"
	"github.com/fencesandbox/fence/internal/isolation"
)

// The network measure's "upstream" is a server in a network namespace of
// its own, joined to the host by a veth in the benchmarking range
// (RFC 2544): traffic from a sandbox takes the real path (its kernel's TCP
// → its TUN → the daemon's user-space stack → the host's kernel → the
// veth), and the same client on the host takes the host's path to the
// same server.
const (
	netHostIP   = "198.18.0.1"
	netServerIP = "198.18.0.2"
)

// netServer is the upstream: a TCP server in its own network namespace.
type netServer struct {
	ns, hostIf string
	ln         net.Listener
	lock       *os.File
}

// startNetServer makes the namespace and veth and starts the server.
func startNetServer() (*netServer, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("the ip command (iproute2) is needed for the network measure")
	}
	// The addresses are fixed: benchmarks on one host take turns.
	lock, err := os.OpenFile("/run/fence-bench-net.lock", os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		lock.Close()
		return nil, err
	}
	removeStaleNetServers()
	sfx := strconv.Itoa(os.Getpid())
	s := &netServer{ns: "fencebench-" + sfx, hostIf: "fbh" + sfx, lock: lock}
	peer := "fbp" + sfx
	ip := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %w: %s", args, err, bytes.TrimSpace(out))
		}
		return nil
	}
	steps := [][]string{
		{"netns", "add", s.ns},
		{"link", "add", s.hostIf, "type", "veth", "peer", "name", peer, "netns", s.ns},
		{"addr", "add", netHostIP + "/30", "dev", s.hostIf},
		{"link", "set", s.hostIf, "up"},
		{"-n", s.ns, "addr", "add", netServerIP + "/30", "dev", peer},
		{"-n", s.ns, "link", "set", peer, "up"},
		{"-n", s.ns, "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if err := ip(st...); err != nil {
			s.close()
			return nil, err
		}
	}
	ln, err := listenInNetns(s.ns, net.JoinHostPort(netServerIP, "0"))
	if err != nil {
		s.close()
		return nil, err
	}
	s.ln = ln
	go s.serve()
	return s, nil
}

// removeStaleNetServers removes what a benchmark killed during its network
// measure left: with the lock held, every fencebench- namespace is a dead
// run's, and deleting it deletes its veth pair (and the host's address on
// it) too.
func removeStaleNetServers() {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "fencebench-") {
			exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
}

// listenInNetns opens a TCP listener in the named network namespace: a
// socket belongs to the namespace it was made in, whatever thread uses it
// later. The thread that entered the namespace is never reused (it exits
// with its goroutine, still locked).
func listenInNetns(ns, addr string) (net.Listener, error) {
	type res struct {
		ln  net.Listener
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			c <- res{err: err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			c <- res{err: fmt.Errorf("entering %s: %w", ns, err)}
			return
		}
		ln, err := net.Listen("tcp", addr)
		c <- res{ln, err}
	}()
	r := <-c
	return r.ln, r.err
}

// serve answers each connection: the client sends the number of bytes it
// wants (8 bytes, big endian), the server sends them and closes.
func (s *netServer) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var hdr [8]byte
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			n := int64(binary.BigEndian.Uint64(hdr[:]))
			buf := make([]byte, 256<<10)
			for n > 0 {
				k, err := c.Write(buf[:min(int64(len(buf)), n)])
				if err != nil {
					return
				}
				n -= int64(k)
			}
		}()
	}
}

func (s *netServer) addr() string { return s.ln.Addr().String() }

func (s *netServer) close() {
	if s.ln != nil {
		s.ln.Close()
	}
	exec.Command("ip", "netns", "del", s.ns).Run()
	exec.Command("ip", "link", "del", s.hostIf).Run()
	s.lock.Close()
}

// DNSName is the name the network measure resolves; the benchmark's DNS
// server (StartDNS) answers it with the upstream server's address.
const DNSName = "bench.fence.test"

// StartDNS starts the benchmark's DNS server on the host's loopback: it
// answers A queries for DNSName with the network measure's server address
// (a long TTL, so that the sandboxes' resolver caches it) and NXDOMAIN to
// everything else. The backend under measure uses it as its upstream.
func StartDNS() (addr string, stop func(), err error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, q *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(q)
		if len(q.Question) == 1 && strings.EqualFold(q.Question[0].Name, DNSName+".") && q.Question[0].Qtype == mdns.TypeA {
			m.Answer = []mdns.RR{&mdns.A{
				Hdr: mdns.RR_Header{Name: q.Question[0].Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 3600},
				A:   net.ParseIP(netServerIP).To4(),
			}}
		} else if len(q.Question) == 1 && strings.EqualFold(q.Question[0].Name, DNSName+".") {
			// The name exists: no record of that type.
		} else {
			m.Rcode = mdns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	return pc.LocalAddr().String(), func() { srv.Shutdown() }, nil
}

// measureNet runs the network measure: the same client in a sandbox allowed
// to reach the server by CIDR, and on the host.
func measureNet(ctx context.Context, opts Options, out io.Writer) error {
	srv, err := startNetServer()
	if err != nil {
		return err
	}
	defer srv.close()
	if opts.Fence == nil {
		return errors.New("the network measure needs Options.Fence")
	}
	pol, err := policy.Compile(policy.Spec{Allow: []policy.Rule{{Prefix: netip.MustParsePrefix(netServerIP + "/32")}, {Name: DNSName}}})
	if err != nil {
		return err
	}
	sb, err := opts.Backend.Create(ctx, isolation.Spec{ID: newID("benchnet"), RootFS: opts.RootFS,
		Network: opts.Fence.New(pol)})
	if err != nil {
		return err
	}
	defer sb.Kill(context.WithoutCancel(ctx))
	args := []string{"bench-client", "--addr", srv.addr(), "--bytes", strconv.FormatInt(opts.NetBytes, 10)}
	hostArgs := args
	if opts.DNSServer != "" {
		// In the sandbox, its resolver (fence's, answering from its cache
		// after the first lookup); on the host, the same server directly.
		args = append(slices.Clone(args), "--dns", DNSName)
		hostArgs = append(slices.Clone(hostArgs), "--dns", DNSName, "--dns-server", opts.DNSServer)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// Alternate, so that a change of the machine's load hits both.
	// This process's CPU is the stack's and the upstream server's during
	// the sandbox's run, the server's alone during the host's (a run:
	// the download, then the connections and lookups, a small part of it
	// for a download of hundreds of MiB).
	var in, host []netclient.Result
	var selfIn, selfHost []float64
	for range 3 {
		c0 := selfCPU()
		r, err := clientInSandbox(ctx, sb, args)
		if err != nil {
			return fmt.Errorf("in the sandbox: %w", err)
		}
		selfIn = append(selfIn, (selfCPU()-c0)/float64(r.Bytes>>20))
		in = append(in, r)
		c0 = selfCPU()
		hb, err := exec.CommandContext(ctx, exe, hostArgs...).Output()
		if err != nil {
			return fmt.Errorf("on the host: %w", err)
		}
		var h netclient.Result
		if err := json.Unmarshal(hb, &h); err != nil {
			return fmt.Errorf("on the host: %w", err)
		}
		selfHost = append(selfHost, (selfCPU()-c0)/float64(h.Bytes>>20))
		host = append(host, h)
	}
	writeNet(out, opts, in, host, selfIn, selfHost)
	return nil
}

// fence's network targets against the host in the same run: a download's
// throughput at least downloadGoal times the host's, and a new connection
// at most connectGoal seconds more than the host's.
const (
	downloadGoal = 0.7
	connectGoal  = 0.0002
)

// verdict says whether a target is met.
func verdict(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

// writeNet reports the network measure: the medians of the sandbox's
// runs (in; selfIn, this process's CPU per MiB during each) and the
// host's (host, selfHost).
func writeNet(out io.Writer, opts Options, in, host []netclient.Result, selfIn, selfHost []float64) {
	med := func(rs []netclient.Result, f func(netclient.Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	bw := func(r netclient.Result) float64 { return r.BytesPerSec }
	cn := func(r netclient.Result) float64 { return r.ConnectP50Sec }
	sIn, sHost := med(in, bw), med(host, bw)
	cIn, cHost := med(in, cn), med(host, cn)
	fmt.Fprintf(out, "network, real path (sandbox kernel TCP → TUN → fence's stack → upstream), same client on the host, median of 3:\n")
	fmt.Fprintf(out, "  bulk download of %d MiB: sandbox %.0f MB/s (%.1f Gbit/s), host %.0f MB/s: %.2fx the host (target ≥ %.1fx: %s)\n",
		opts.NetBytes>>20, sIn/1e6, sIn*8/1e9, sHost/1e6, sIn/sHost, downloadGoal, verdict(sIn/sHost >= downloadGoal))
	// CPU per MiB: a machine without idle CPU divides its throughput
	// in this proportion, whatever the load.
	perMiB := func(r netclient.Result) float64 { return r.DownloadCPUSec / float64(r.Bytes>>20) }
	pick := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	fIn, fHost, kIn, kHost := pick(selfIn), pick(selfHost), med(in, perMiB), med(host, perMiB)
	fmt.Fprintf(out, "  CPU per MiB downloaded, median of 3: sandbox path %.2f ms (fence's stack and the server %.2f, the client %.2f), host path %.2f ms (the server %.2f, the client %.2f): host / sandbox %.2f\n",
		(fIn+kIn)*1e3, fIn*1e3, kIn*1e3, (fHost+kHost)*1e3, fHost*1e3, kHost*1e3, (fHost+kHost)/(fIn+kIn))
	fmt.Fprintf(out, "  new connection (connect, 1 byte, close), p50: sandbox %.2f ms, host %.2f ms: %+.2f ms (target ≤ %+.1f ms: %s)\n",
		cIn*1e3, cHost*1e3, (cIn-cHost)*1e3, connectGoal*1e3, verdict(cIn-cHost <= connectGoal))
	if opts.DNSServer != "" {
		dn := func(r netclient.Result) float64 { return r.DNSP50Sec }
		df := func(r netclient.Result) float64 { return r.DNSFirstSec }
		fmt.Fprintf(out, "  DNS lookup of an allowed name, cached, p50: sandbox %.3f ms (through fence's resolver; first lookup %.2f ms), host %.3f ms (the server directly)\n",
			med(in, dn)*1e3, med(in, df)*1e3, med(host, dn)*1e3)
	}
}

// selfCPU is this process's CPU time so far, user and system, in
// seconds.
func selfCPU() float64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// clientInSandbox runs `fence bench-client` inside sb, as the sandbox's
// root, through the agent.
func clientInSandbox(ctx context.Context, sb isolation.Sandbox, args []string) (netclient.Result, error) {
	var r netclient.Result
	out, err := runAsRoot(ctx, processClient(sb), boot.Path, args...)
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(out, &r)
}
