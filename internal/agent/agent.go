package agent

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/boot"
	"github.com/fencesandbox/fence/internal/agent/fs"
	"github.com/fencesandbox/fence/internal/agent/process"
	"github.com/fencesandbox/fence/internal/agent/sudo"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// maxMessageBytes bounds one Connect request message (SendInput carries
// stdin; everything else is small).
const maxMessageBytes = 32 << 20

// Options configures the agent. Zero values are documented defaults.
type Options struct {
	// Config is the sandbox's env vars, default user (empty: "user" if that
	// account exists, else "root") and default workdir (empty: the user's
	// home).
	Config boot.Config
	Logger *slog.Logger // nil = discard
	// SudoSocket, if set, is where Serve offers sudo to the sandbox's
	// users (see package sudo).
	SudoSocket string
	// ServicesFile, if set, names the template's services file (see
	// ServicesFile), whose services Serve starts and keeps running.
	ServicesFile string
	// Serving, if set, is called once the agent serves: it answers
	// requests and may start processes.
	Serving func()
	// IdleThreads, when above zero, is how many OS threads the agent keeps
	// once no process it started has run for a second
	// (process.Options.IdleThreads).
	IdleThreads int
	// Built, if set, is the agent's handler and services made ahead by
	// Build (with these options but any Config): Serve gives them this
	// Config, as POST /init does, instead of making them.
	Built *Built
}

// Built is the agent's handler and the services behind it, made ahead of
// Serve: a sandbox's init makes them while it waits for its sandbox, so
// that its first command does not wait for them.
type Built struct{ b *built }

// Build makes the handler and services Serve would make with opts, and
// has the process service answer one stream in memory
// (process.WarmStream), so that the first command's stream finds its
// encoders built. It opens nothing, reads no file and starts no process:
// it may run before the process is in its sandbox's root.
func Build(opts Options) *Built {
	b := build(opts)
	process.WarmStream(b.procHandler)
	return &Built{b}
}

// Serve serves envd's protocol on ln until ctx is done. It closes ln. On
// return, open streams are aborted and the processes the agent started are
// killed. It returns nil when ctx ended it.
//
// Signals that would end a Go program (SIGHUP, SIGINT, SIGTERM, SIGQUIT,
// SIGUSR1, …) are caught and ignored while Serve runs: the agent is PID 1,
// and Go's default for them (exit) would let `kill -TERM 1` by the
// sandbox's root end the sandbox. A sandbox ends only from the host side
// (the daemon kills its PID 1, or the lifeline breaks). Caught, not
// SIG_IGN, so the processes the agent starts get the default disposition
// back at exec.
func Serve(ctx context.Context, ln net.Listener, opts Options) error {
	// A sandbox's first command waits for the agent's start: what does
	// not depend on the rest runs beside it (unless Prepare has done it).
	threads := make(chan struct{})
	go func() {
		Prepare()
		close(threads)
	}()
	var a *built
	if opts.Built != nil {
		a = opts.Built.b
		a.procs.SetEnvVars(opts.Config.EnvVars)
		a.users.Set(opts.Config.DefaultUser, opts.Config.DefaultWorkdir)
	} else {
		a = build(opts)
	}
	h, closeFn := a.mux, a.close
	defer closeFn()
	// The agent answers from here on; the rest of its start (signal
	// handling, the spare threads, sudo) runs beside the first request,
	// and no process of the sandbox starts before it is done.
	ready := make(chan struct{})
	a.procs.HoldForks(ready)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(logger(opts).Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	// The sandbox is set up (its root is this process's, the daemon has
	// set the agent's OOM score): what a first command would resolve for
	// itself, the default user and that score, is resolved beside the
	// create's answer to its client instead.
	go func() {
		a.users.Warm()
		a.procs.Warm()
	}()

	if !signalsCaught.Load() {
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, ignoredSignals...)
		defer func() {
			signal.Stop(sigs)
			close(sigs)
		}()
		go ignoreSignals(sigs, logger(opts))
	}
	if opts.SudoSocket != "" {
		sln, err := sudo.Listen(opts.SudoSocket)
		if err != nil {
			logger(opts).Warn("sudo unavailable", "err", err)
		} else {
			srv := &sudo.Server{Procs: a.procs, Log: logger(opts)}
			go srv.Serve(ctx, sln)
		}
	}
	// The spare threads exist before anything of the sandbox runs.
	<-threads
	close(ready)
	if opts.Serving != nil {
		opts.Serving()
	}
	if opts.ServicesFile != "" {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		runServices(sctx, opts.ServicesFile, a.procs, a.users, logger(opts))
	}
	select {
	case <-ctx.Done():
		srv.Close()
		<-errc
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

func logger(opts Options) *slog.Logger {
	if opts.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return opts.Logger
}

// CatchSignals catches and ignores the signals Serve ignores, from now on
// and for the rest of the process's life. A process that becomes the
// agent later (the native backend's init) calls it while it waits: os/signal
// enables each signal through a hand-off between two threads, eighteen of
// them, which Serve would otherwise make beside a sandbox's first command.
// Serve then leaves the signals as they are.
//
// A PID 1 instead gives the signals their default action back: the kernel
// drops every signal a PID 1 has left at its default unless it is sent
// from an ancestor namespace (the host) as SIGKILL or SIGSTOP, or raised
// by the process's own fault. This does the same as catching them, without
// the two OS threads os/signal keeps for good once a signal is caught.
func CatchSignals(log *slog.Logger) {
	catchOnce.Do(func() {
		if os.Getpid() == 1 && defaultSignals() == nil {
			signalsCaught.Store(true)
			return
		}
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, ignoredSignals...)
		go ignoreSignals(sigs, log)
		signalsCaught.Store(true)
	})
}

var (
	catchOnce     sync.Once
	signalsCaught atomic.Bool
)

func ignoreSignals(sigs <-chan os.Signal, log *slog.Logger) {
	for sig := range sigs {
		log.Debug("ignoring signal", "signal", sig)
	}
}

// defaultSignals sets the action of every ignored signal to the
// default (SIG_DFL), bypassing os/signal. A process the Go runtime forks
// gets the default back anyway before it executes.
func defaultSignals() error {
	for _, s := range ignoredSignals {
		var act [4]uint64 // the kernel's struct sigaction, SIG_DFL: all zero
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(s.(syscall.Signal)), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
			return e
		}
	}
	return nil
}

// ignoredSignals are the signals whose Go default would end the agent.
// (SIGKILL and SIGSTOP from inside the sandbox never reach its PID 1.)
var ignoredSignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGVTALRM,
	syscall.SIGPROF, syscall.SIGIO, syscall.SIGPWR, syscall.SIGSTKFLT,
	syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGTRAP, syscall.SIGABRT,
	syscall.SIGSYS, syscall.SIGPIPE,
}

// NewHandler returns the agent's http.Handler (for tests and in-process use)
// plus a close func, which kills the processes started through the handler
// and stops its watchers.
//
// Routes: the Connect services /process.Process/* and
// /filesystem.Filesystem/* (Connect, gRPC and gRPC-Web; JSON or binary),
// GET /health, GET and POST /files, GET /envs, POST /init.
func NewHandler(opts Options) (http.Handler, func()) {
	a := build(opts)
	return a.mux, a.close
}

// built is the agent's handler and the services behind it.
type built struct {
	mux         *http.ServeMux
	procs       *process.Service
	procHandler http.Handler // procs' routes
	users       *users.Resolver
	close       func()
}

// compressMinBytes is the smallest message the agent compresses.
const compressMinBytes = 8 << 10

func build(opts Options) *built {
	log := logger(opts)
	resolver := &users.Resolver{DefaultUser: opts.Config.DefaultUser, DefaultWorkdir: opts.Config.DefaultWorkdir}
	procs := process.NewService(process.Options{Users: resolver, EnvVars: opts.Config.EnvVars,
		Logger: log.With("svc", "process"), IdleThreads: opts.IdleThreads})
	files := fs.NewService(fs.Options{Users: resolver, Logger: log.With("svc", "filesystem")})

	// Small messages (most process events) go uncompressed even to clients
	// that accept gzip: a compressor costs about a megabyte to set up and
	// saves nothing on a few bytes.
	copts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessageBytes), connect.WithCompressMinBytes(compressMinBytes)}
	mux := http.NewServeMux()
	procPath, procHandler := procs.Handler(copts...)
	mux.Handle(procPath, procHandler)
	mux.Handle(files.Handler(copts...))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /files", files.Download)
	mux.HandleFunc("HEAD /files", files.Download)
	mux.HandleFunc("POST /files", files.Upload)
	mux.HandleFunc("GET /envs", func(w http.ResponseWriter, r *http.Request) {
		envs := procs.GlobalEnv()
		if envs == nil {
			envs = map[string]string{}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(envs)
	})
	// POST /init configures an agent started ahead of its sandbox's
	// request (a warm pool). The daemon's proxy never forwards it from
	// outside; inside, the sandbox may call it, which changes nothing it
	// could not change itself.
	mux.HandleFunc("POST /init", func(w http.ResponseWriter, r *http.Request) {
		var cfg boot.Config
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&cfg); err != nil {
			fs.WriteError(w, http.StatusBadRequest, "decoding config: "+err.Error())
			return
		}
		procs.SetEnvVars(cfg.EnvVars)
		resolver.Set(cfg.DefaultUser, cfg.DefaultWorkdir)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fs.WriteError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return &built{mux: mux, procs: procs, procHandler: procHandler, users: resolver, close: func() {
		procs.Close()
		files.Close()
	}}
}

// prepared makes Prepare's work happen once per process.
var prepared sync.Once

// codecsWarmed is closed once Prepare's warm-up of the codecs has run.
var codecsWarmed = make(chan struct{})

// Prepare does the part of the agent's start that depends on nothing of
// its sandbox: it starts the spare threads (spareThreads), and sets up the
// codecs of the process service for the first Start in the background
// (the first Start otherwise does it itself; nothing waits for it). Serve
// calls it; a process that becomes an agent later (the native backend's
// init, started ahead of its sandbox) calls it while it waits, so a
// sandbox's first command does not. Safe to call more than once and
// concurrently; later calls wait for the first's spare threads.
func Prepare() {
	prepared.Do(func() {
		go func() {
			process.WarmCodecs()
			close(codecsWarmed)
		}()
		process.WarmThreadCount()
		if !noSpares.Load() {
			spareThreads(spareThreadCount)
		}
	})
}

// noSpares is set by NoSpareThreads.
var noSpares atomic.Bool

// NoSpareThreads makes Prepare start no spare threads: for an agent that
// never waits on a blocked thread and runs on one P (the native backend's
// init), whose runtime needs no more threads than it keeps idle. Call it
// before Prepare.
func NoSpareThreads() { noSpares.Store(true) }

// spareThreadCount is how many idle OS threads the agent keeps beyond what
// it has started with. Each costs one task of the sandbox's pids budget
// and about 40 KB of host memory.
const spareThreadCount = 4

// spareThreads makes the Go runtime start n more OS threads now and keep
// them idle. The agent's threads count against the sandbox's pids limit: a
// workload that takes every task left (a fork bomb at the limit) would
// otherwise find the runtime needing one more thread at that moment, and
// a Go program that cannot make a thread dies ("failed to create new OS
// thread"), taking the sandbox with it. The runtime reuses idle threads
// before it makes new ones, and never ends one that was unlocked.
func spareThreads(n int) {
	var locked, release sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	for range n {
		go func() {
			// Locked, the goroutine keeps its thread while it waits, so
			// each of the n takes a thread of its own.
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	release.Done()
}
