package insandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent"
	"github.com/fencesandbox/fence/internal/agent/boot"
	"github.com/fencesandbox/fence/internal/agent/sudo"
	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
)

// agentMemoryLimit is the Go runtime's soft memory limit in the agent.
const agentMemoryLimit = 64 << 20

// RunAgent is the `fence agent` role: PID 1 inside a sandbox. It takes its
// listener and configuration as package boot describes and serves until
// the sandbox dies.
func RunAgent(ctx context.Context) error {
	var cfg boot.Config
	if raw := os.Getenv(boot.ConfigEnv); raw != "" {
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			return fmt.Errorf("decoding agent config: %w", err)
		}
	}
	os.Unsetenv(boot.ConfigEnv)
	listen, peer := os.Getenv(boot.ListenEnv), os.Getenv(boot.PeerEnv)
	os.Unsetenv(boot.ListenEnv)
	os.Unsetenv(boot.PeerEnv)
	var tcp *tcpListen
	if listen != "" {
		t, err := parseTCP(listen, peer)
		if err != nil {
			return err
		}
		tcp = &t
	}
	return serveAgent(ctx, cfg, tcp, nil, nil)
}

// tcpListen is a TCP listener's address and the one peer it serves.
type tcpListen struct {
	addr string
	peer netip.Addr
}

// parseTCP reads ListenEnv's and PeerEnv's values. A TCP listener
// without a peer is refused: it would serve every process of the
// sandbox.
func parseTCP(listen, peer string) (tcpListen, error) {
	if peer == "" {
		return tcpListen{}, fmt.Errorf("agent listener: %s is set but %s is not", boot.ListenEnv, boot.PeerEnv)
	}
	p, err := netip.ParseAddr(peer)
	if err != nil {
		return tcpListen{}, fmt.Errorf("agent listener: %s: %w", boot.PeerEnv, err)
	}
	return tcpListen{addr: listen, peer: p}, nil
}

// RunInit is the `fence init` role of the native backend: it sets the
// sandbox up (package nsinit) and then serves as its agent, in the same
// process: PID 1 of the sandbox, on the listener and lifeline the daemon
// gave it. The agent is not executed anew; its runtime and packages were
// started while the init waited for its sandbox.
func RunInit() error {
	// While the init waits for its sandbox (it usually is started ahead),
	// the agent's start is prepared and its handler and services are
	// made; they get the sandbox's configuration when it serves. Its
	// threads are the init's: nsinit drops their privileges with the rest.
	var built *agent.Built
	prepared := make(chan struct{})
	cfg, err := nsinit.Init(func() {
		defer close(prepared)
		agent.NoSpareThreads()
		agent.Prepare()
		opts := agentOptions(boot.Config{}, nil)
		opts.IdleThreads = idleThreads
		agent.CatchSignals(opts.Logger)
		built = agent.Build(opts)
	})
	if err != nil {
		return err
	}
	<-prepared
	// The daemon counts the sandbox started once the agent serves: an
	// agent that dies before (a Go runtime that cannot make a thread it
	// needs under the sandbox's pids limit) fails the create.
	serving := func() {
		if err := nsinit.Serving(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if err := serveAgent(context.Background(), cfg, nil, built, serving); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// idleThreads is how many OS threads the native backend's agent keeps
// when no command runs: the Go runtime's monitor (sysmon), its template
// thread (which starts threads for locked goroutines), the thread that
// runs the agent's one P (package nsinit) and one that takes the P over
// while the first is blocked in a system call.
const idleThreads = 4

// agentOptions are the agent's options for cfg, with its handler and
// services made ahead when built is set.
func agentOptions(cfg boot.Config, built *agent.Built) agent.Options {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return agent.Options{Config: cfg, Logger: log, SudoSocket: sudo.SocketPath,
		ServicesFile: agent.ServicesFile, Built: built}
}

// serveAgent serves as the sandbox's agent with cfg (and the handler and
// services built ahead, if not nil), on a TCP listener for tcp's peer
// alone when tcp is set, else on the listener and lifeline of package
// boot. serving, if not nil, is called once the agent serves.
func serveAgent(ctx context.Context, cfg boot.Config, tcp *tcpListen, built *agent.Built, serving func()) error {
	ln, err := agentListener(tcp)
	if err != nil {
		return err
	}
	// Not dumpable: the sandbox's root, which has no CAP_SYS_PTRACE, then
	// cannot read or write the agent's memory and descriptors through
	// /proc/1. (Its children become dumpable again at exec.)
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the agent non-dumpable: %w", err)
	}
	// The sandbox ends when its supervisor dies (EOF on the lifeline) or
	// is killed from the host, never by a signal sent from inside: ctx,
	// which the command's SIGINT/SIGTERM handling cancels, is detached.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if tcp == nil {
		// A backend that hands the agent a listener also hands it a
		// lifeline (see package boot).
		unix.CloseOnExec(boot.LifelineFD)
		// Non-blocking, the lifeline is read in the poller: a blocking
		// read would keep an OS thread for the sandbox's whole life.
		if err := unix.SetNonblock(boot.LifelineFD, true); err != nil {
			return fmt.Errorf("reading the lifeline: %w", err)
		}
		life := os.NewFile(boot.LifelineFD, "lifeline")
		go func() {
			var b [1]byte
			for {
				if _, err := life.Read(b[:]); err != nil {
					cancel()
					return
				}
			}
		}()
	}
	// The agent's heap holds little beyond queued output (bounded by
	// process.DefaultOutputBudget): a soft limit makes the collector work
	// harder before the agent grows, so a sandbox near its memory limit
	// loses garbage, not workers.
	debug.SetMemoryLimit(agentMemoryLimit)
	opts := agentOptions(cfg, built)
	opts.Serving = serving
	return agent.Serve(ctx, ln, opts)
}

// agentListener returns the inherited listener, or, when tcp is set, a
// TCP listener that serves tcp's peer alone.
func agentListener(tcp *tcpListen) (net.Listener, error) {
	if tcp != nil {
		ln, err := net.Listen("tcp", tcp.addr)
		if err != nil {
			return nil, fmt.Errorf("opening agent listener: %w", err)
		}
		return agent.OnlyFrom(ln, tcp.peer), nil
	}
	f := os.NewFile(boot.ListenerFD, "listener")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("opening agent listener: %w", err)
	}
	return ln, nil
}
