package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/router"
)

// Deps are the entry points cmd/fence injects, so that this package uses
// no daemon, agent or backend internals (of the daemon and the router it
// knows only their Config, which their commands' flags bind to). A nil
// entry makes its verb fail with "not available in this build".
type Deps struct {
	// Serve runs the daemon until ctx is done (`fence serve`), configured
	// by the command's flags.
	Serve func(ctx context.Context, c fencedaemon.Config) error
	// BuildTemplate builds template name into templatesDir, writing
	// progress to progress (`fence template build`).
	BuildTemplate func(ctx context.Context, dataDir, templatesDir, name string, force bool, progress io.Writer) error
	// BuildImageTemplate builds template name from a container image
	// (`fence template build NAME --from-image REF|--from-archive PATH`).
	BuildImageTemplate func(ctx context.Context, dataDir, templatesDir, name string, img ImageSource, progress io.Writer) error
	// NewLocal starts a sandbox without a daemon (for `fence run`); its
	// DialAgent reaches its agent. The caller kills it.
	NewLocal func(ctx context.Context, opts LocalOptions) (isolation.Sandbox, error)
	// Agent runs the in-sandbox agent role (hidden `fence agent`).
	Agent func(ctx context.Context) error
	// SandboxInit runs the hidden internal role the native backend starts
	// inside a new sandbox (hidden `fence init`).
	SandboxInit func() error
	// Bench runs the benchmarks and writes the report to out (`fence bench`).
	Bench func(ctx context.Context, opts BenchOptions, out io.Writer) error
	// BenchClient is the network measure's client (hidden `fence
	// bench-client`), run by `fence bench` in a sandbox and on the host.
	BenchClient func(args []string, out io.Writer) error
	// Router runs `fence router` until ctx is done, configured by the
	// command's flags.
	Router func(ctx context.Context, c router.Config) error
}

// ImageSource is the image of `fence template build --from-image` or
// `--from-archive`.
type ImageSource struct {
	Ref      string // registry reference, or the image in the archive
	Archive  string // OCI layout directory or docker-save tarball
	Platform string // os/arch[/variant]
	// Username and Password, or Token, authenticate to the registry
	// (from FENCE_REGISTRY_USERNAME, FENCE_REGISTRY_PASSWORD and
	// FENCE_REGISTRY_TOKEN).
	Username, Password, Token string
}

// ExitError carries the exit code of a command run in a sandbox. Run exits
// with Code and prints nothing for it.
type ExitError struct {
	Code int
}

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// usageError is a mistake in the command line (exit code 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// errUnavailable is returned by verbs whose Deps entry is nil.
func errUnavailable(verb string) error {
	return fmt.Errorf("%s is not available in this build", verb)
}

// Root returns the fence command tree.
func Root(deps Deps) *cobra.Command {
	root := &cobra.Command{
		Use:   "fence",
		Short: "Disposable Linux sandboxes for AI agents",
		Long: `fence gives agents disposable Linux sandboxes over an E2B-compatible API.

Run one command fenced on this machine, without a daemon:
  fence run -- CMD

Or start the daemon and point the E2B SDKs (E2B_API_URL, E2B_SANDBOX_URL) or
the fence client verbs at it:
  fence serve`,
		Example: `  # Build the small test template, then run a command in a throwaway sandbox
  fence template build minimal
  fence run -- echo hello

  # Serve the API, then create a sandbox and run a command in it
  fence serve &
  id=$(fence sandbox create --template base)
  fence exec $id -- uname -a
  fence sandbox kill $id`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{err} })
	root.AddCommand(
		serveCmd(deps),
		routerCmd(deps),
		templateCmd(deps),
		runCmd(deps),
		sandboxCmd(),
		secretCmd(),
		volumeCmd(),
		teamCmd(),
		keyCmd(),
		tokenCmd(),
		auditCmd(),
		approvalsCmd(),
		execCmd(),
		cpCmd(),
		benchCmd(deps),
		selftestCmd(deps),
		benchClientCmd(deps),
		agentCmd(deps),
		initCmd(deps),
		probeCmd(),
		mcpCmd(),
		sshCmd(),
	)
	return root
}

// Run runs the fence CLI with args (without the program name) and returns
// the process exit code. It prints errors to the root's stderr.
func Run(ctx context.Context, deps Deps, args []string) int {
	return Execute(ctx, Root(deps), args)
}

// Execute runs an already built command tree (see Root) with args and
// returns the exit code.
func Execute(ctx context.Context, root *cobra.Command, args []string) int {
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	stderr := root.ErrOrStderr()
	var ue *usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") {
		fmt.Fprintf(stderr, "fence: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return 2
	}
	fmt.Fprintf(stderr, "fence: %v\n", err)
	return 1
}

// Argument validators that report usage errors.

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return nil
}

func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%q needs exactly %d argument(s), got %d", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}

func minArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usagef("%q needs at least %d argument(s), got %d", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}

// groupCmd is a command that only holds subcommands.
func groupCmd(use, short string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
}
