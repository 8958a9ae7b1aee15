package cli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
)

// killTimeout bounds the kill of a local sandbox on exit.
const killTimeout = 30 * time.Second

const runLong = `Run CMD in a new sandbox on this machine and destroy the sandbox when CMD
ends. No daemon is needed. fence exits with CMD's exit code (128+n if a
signal n ended it).

stdin, stdout and stderr are attached; when stdin is a terminal CMD runs on
a terminal too. SIGINT or SIGTERM to fence kills the sandbox.

The sandbox reaches no network. With --ask, a lookup of a name waits for
your answer on fence's stdin (CMD then gets none): o once (the name is
reachable for 30 s), s for this sandbox, d deny; no answer within a
minute, or the end of stdin, refuses it.

The sandbox sees none of your environment: pass variables with -e. Host
directories are visible only through -v, written as the sandbox's user:
files it writes land owned by the directory's owner (root, for root's
project). The host's /, /proc, /sys, /dev and /run and fence's data and
templates directories cannot be mounted; its system trees (/etc, /usr,
/var/lib, ...), /root, /home and /tmp themselves, and a home's hidden
entries only read-only (:ro).`

const runExample = `  # Run a shell command in the minimal template
  fence run -- sh -c 'echo hello from $(hostname)'

  # Let a tool work on the current directory, read-only, with one variable
  fence run -v "$PWD:/work:ro" -w /work -e LANG=C.UTF-8 -- ls -la

  # An interactive shell in the base template, killed after 10 minutes
  fence run --template base --timeout 10m -- bash

  # Approve on this terminal each name the command looks up
  fence run --ask --template base -- curl -sS https://example.com/`

func runCmd(deps Deps) *cobra.Command {
	var (
		o       LocalOptions
		lim     sandbox.Defaults
		binds   []string
		env     []string
		user    string
		tdir    string
		noStdin bool
		ask     bool
	)
	cmd := &cobra.Command{
		Use:     "run [flags] -- CMD [ARG...]",
		Short:   "Run a command in a throwaway sandbox, without a daemon",
		Long:    runLong,
		Example: runExample,
		Args:    minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.NewLocal == nil {
				return errUnavailable("fence run")
			}
			if err := checkLimits(lim); err != nil {
				return err
			}
			o.Limits = lim.Limits()
			var err error
			if o.Timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			if o.Env, err = parseEnv(env); err != nil {
				return err
			}
			o.TemplatesDir = templatesDir(tdir, o.DataDir)
			for _, v := range binds {
				b, err := parseBind(v, o.DataDir, o.TemplatesDir)
				if err != nil {
					return err
				}
				o.Binds = append(o.Binds, b)
			}
			spec := client.ProcessSpec{Cmd: args[0], Args: args[1:], Env: o.Env, Cwd: o.Workdir, User: user, Timeout: o.Timeout}
			s := &session{
				in: cmd.InOrStdin(), out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(),
				stdin: !noStdin,
				// Any signal ends the run; the deferred Kill removes the sandbox.
				onSignal: func(context.Context, *client.Process, syscall.Signal, int) bool { return true },
			}
			s.tty = terminalFd(s.in) >= 0
			if ask {
				// fence's stdin answers the prompts: CMD gets none, and
				// no terminal to put in raw mode.
				s.stdin, s.tty = false, false
				actx, cancel := context.WithCancel(cmd.Context())
				defer cancel()
				o.Ask = newTerminalAsker(actx, cmd.InOrStdin(), cmd.ErrOrStderr(), 0).Ask
			}
			sigs, stop := notifySignals()
			defer stop()
			s.sigs = sigs
			code, err := runLocal(cmd.Context(), deps.NewLocal, o, s, spec)
			if err != nil {
				return err
			}
			if code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.SetInterspersed(false)
	fs.StringVar(&o.Template, "template", "minimal", "template the sandbox starts from")
	fs.DurationVar(&o.Timeout, "timeout", 0, "kill the sandbox after this long (0: no limit)")
	fs.StringVar(&o.DataDir, "data-dir", DefaultDataDir, "directory for fence's state")
	fs.StringVar(&tdir, "templates-dir", "", "directory of built templates (default DATA-DIR/templates)")
	fs.StringArrayVarP(&binds, "volume", "v", nil, "mount a host path: HOSTPATH:PATH[:ro] (repeatable)")
	fs.StringVarP(&o.Workdir, "workdir", "w", "", "working directory inside the sandbox")
	fs.StringArrayVarP(&env, "env", "e", nil, "set an environment variable: KEY=VALUE (repeatable)")
	fs.StringVarP(&user, "user", "u", "", "user to run CMD as, e.g. root (default: the template's user)")
	fs.BoolVar(&noStdin, "no-stdin", false, "do not attach stdin (CMD reads EOF)")
	fs.StringVar(&o.Backend, "backend", "", "isolation backend: native (the default) or gvisor (runsc, see scripts/build-runsc.sh)")
	fs.BoolVar(&ask, "ask", false, "network approval \"ask\": a lookup of a name the sandbox may not reach waits (up to 1m) for your answer on stdin: once, for this sandbox, or deny; CMD gets no stdin")
	fs.StringVar(&o.DNSUpstream, "dns-upstream", "", "resolver (ip:port) that answers the sandbox's allowed lookups (default: the host's first nameserver)")
	addLimitFlags(fs, &lim)
	return cmd
}

// runLocal starts a local sandbox, runs spec in it through s and kills the
// sandbox.
func runLocal(ctx context.Context, newLocal func(context.Context, LocalOptions) (isolation.Sandbox, error), o LocalOptions, s *session, spec client.ProcessSpec) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sb, err := newLocal(ctx, o)
	if err != nil {
		return 0, fmt.Errorf("starting sandbox: %w", err)
	}
	defer func() {
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		defer kcancel()
		sb.Kill(kctx)
	}()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return sb.DialAgent(ctx)
		},
		DisableCompression: true,
	}
	defer tr.CloseIdleConnections()
	e := client.NewEnvd(&http.Client{Transport: tr}, "http://agent", nil)
	code, err := s.run(ctx, e, spec)
	if err != nil {
		select {
		case <-sb.Done():
			return 0, fmt.Errorf("sandbox stopped: %w", err)
		default:
		}
		return 0, fmt.Errorf("running %s: %w", spec.Cmd, err)
	}
	return code, nil
}
