package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// clientFlags are the flags of every verb that talks to a daemon.
type clientFlags struct {
	url, apiKey, dataDir string
}

func (f *clientFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&f.url, "url", "", "daemon URL (default $FENCE_URL, else "+DefaultURL+")")
	fs.StringVar(&f.apiKey, "api-key", "", "API key (default $FENCE_API_KEY, else read from DATA-DIR/api-key)")
	fs.StringVar(&f.dataDir, "data-dir", DefaultDataDir, "the daemon's data directory, to read its api-key")
}

// client resolves the flags, then the environment, then the defaults.
func (f *clientFlags) client() (*client.Client, error) {
	u := f.url
	if u == "" {
		u = os.Getenv("FENCE_URL")
	}
	if u == "" {
		u = DefaultURL
	}
	key := f.apiKey
	if key == "" {
		key = os.Getenv("FENCE_API_KEY")
	}
	if key == "" {
		b, err := os.ReadFile(filepath.Join(f.dataDir, "api-key"))
		if err != nil {
			return nil, fmt.Errorf("no API key: pass --api-key or set FENCE_API_KEY (reading %s: %w)", filepath.Join(f.dataDir, "api-key"), err)
		}
		key = strings.TrimSpace(string(b))
	}
	return client.New(u, key), nil
}

// eachArg is the body of a verb that does one thing to every argument
// (kill, delete): one client for all of them, every argument tried even
// after one failed, and the failures joined.
func (f *clientFlags) eachArg(do func(c *client.Client, ctx context.Context, arg string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		var errs []error
		for _, a := range args {
			if err := do(c, cmd.Context(), a); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
}

// parseTimeout parses a duration ("90s", "5m") or a number of seconds.
func parseTimeout(s string) (time.Duration, error) {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, usagef("invalid duration %q: want e.g. 90s, 5m or a number of seconds", s)
	}
	return d, nil
}

func sandboxCmd() *cobra.Command {
	group := groupCmd("sandbox", "Create, list and kill sandboxes on a daemon")
	group.Aliases = []string{"sandboxes", "sb"}
	group.AddCommand(sandboxCreateCmd(), sandboxListCmd(), sandboxKillCmd(), sandboxTimeoutCmd(), sandboxDownloadsCmd(), sandboxExportCmd())
	group.AddCommand(sandboxLayerCmds()...)
	return group
}

func sandboxCreateCmd() *cobra.Command {
	var (
		cf       clientFlags
		template string
		timeout  time.Duration
		metadata []string
		env      []string
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its ID",
		Example: `  id=$(fence sandbox create --template base --timeout 10m --metadata owner=alice)
  fence exec $id -- python3 -c 'print(1+1)'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parsePairs("metadata", metadata)
			if err != nil {
				return err
			}
			envs, err := parseEnv(env)
			if err != nil {
				return err
			}
			if timeout < 0 {
				return usagef("--timeout must not be negative")
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			req := api.NewSandbox{TemplateID: template, Metadata: md, EnvVars: envs}
			if timeout > 0 {
				t := int32((timeout + time.Second - 1) / time.Second)
				req.Timeout = &t
			}
			sb, err := c.Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.ID())
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&template, "template", "base", "template the sandbox starts from")
	fs.DurationVar(&timeout, "timeout", 0, "time to live (default: the daemon's)")
	fs.StringArrayVar(&metadata, "metadata", nil, "metadata KEY=VALUE (repeatable)")
	fs.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE for every command (repeatable)")
	cf.add(fs)
	return cmd
}

func sandboxListCmd() *cobra.Command {
	var (
		cf       clientFlags
		asJSON   bool
		metadata []string
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List sandboxes",
		Example: `  fence sandbox list
  fence sandbox list --metadata owner=alice --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parsePairs("metadata", metadata)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			items, err := c.List(cmd.Context(), client.ListOptions{Metadata: md})
			if err != nil {
				return err
			}
			return printSandboxes(cmd.OutOrStdout(), items, asJSON)
		},
	}
	fs := cmd.Flags()
	fs.BoolVar(&asJSON, "json", false, "print JSON (the API's ListedSandbox objects)")
	fs.StringArrayVar(&metadata, "metadata", nil, "only sandboxes with metadata KEY=VALUE (repeatable)")
	cf.add(fs)
	return cmd
}

func printSandboxes(w io.Writer, items []api.ListedSandbox, asJSON bool) error {
	if asJSON {
		if items == nil {
			items = []api.ListedSandbox{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(items)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tSTARTED\tENDS")
	for _, s := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.SandboxID, s.TemplateID, s.State,
			s.StartedAt.UTC().Format(time.RFC3339), s.EndAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func sandboxKillCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "kill ID...",
		Short:   "Kill sandboxes",
		Example: `  fence sandbox kill 8f2kq0x1m3 x9d0c2b7aa`,
		Args:    minArgs(1),
		RunE:    cf.eachArg((*client.Client).Kill),
	}
	cf.add(cmd.Flags())
	return cmd
}

func sandboxTimeoutCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "timeout ID DURATION",
		Short: "Set a sandbox's time to live, from now",
		Long:  "Set a sandbox's time to live, counted from now. It may shorten it.",
		Example: `  fence sandbox timeout 8f2kq0x1m3 30m
  fence sandbox timeout 8f2kq0x1m3 90   # seconds`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseTimeout(args[1])
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			return c.SetTimeout(cmd.Context(), args[0], d)
		},
	}
	cf.add(cmd.Flags())
	return cmd
}

func execCmd() *cobra.Command {
	var (
		cf          clientFlags
		interactive bool
		tty         bool
		user        string
		workdir     string
		env         []string
	)
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- CMD [ARG...]",
		Short: "Run a command in a sandbox on a daemon",
		Long: `Run CMD in the sandbox ID and exit with its exit code (128+n if a signal n
ended it). stdout and stderr are attached; -i attaches stdin, -t runs CMD on
a terminal (raw mode and window size follow when stdin is a terminal).

SIGINT or SIGTERM is forwarded to CMD; a second one detaches, leaving CMD
running in the sandbox.`,
		Example: `  fence exec $id -- ls -la /
  echo 'print(6*7)' | fence exec -i $id -- python3
  fence exec -it -u root -w /tmp $id -- bash`,
		Args: minArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[1] == "--" { // flag parsing stopped at ID, so "--" is still there
				args = append(args[:1], args[2:]...)
				if len(args) < 2 {
					return usagef("missing CMD after --")
				}
			}
			envs, err := parseEnv(env)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			id := args[0]
			d, err := c.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			e := c.Sandbox(id, d.EnvdAccessToken).Envd()
			spec := client.ProcessSpec{Cmd: args[1], Args: args[2:], Env: envs, Cwd: workdir, User: user}
			sigs, stop := notifySignals()
			defer stop()
			s := &session{
				in: cmd.InOrStdin(), out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(),
				tty: tty, stdin: interactive, sigs: sigs,
				onSignal: forwardSignal,
			}
			code, err := s.run(cmd.Context(), e, spec)
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
	fs.BoolVarP(&interactive, "interactive", "i", false, "attach stdin")
	fs.BoolVarP(&tty, "tty", "t", false, "run on a terminal")
	fs.StringVarP(&user, "user", "u", "", "user to run CMD as (default: the sandbox's user)")
	fs.StringVarP(&workdir, "workdir", "w", "", "working directory (default: the user's)")
	fs.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE for CMD (repeatable)")
	cf.add(fs)
	return cmd
}

// forwardSignal sends the first signal to the process and detaches on the
// second.
func forwardSignal(ctx context.Context, p *client.Process, sig syscall.Signal, n int) bool {
	if n > 1 {
		return true
	}
	if err := p.Signal(ctx, sig); err != nil {
		return p.Signal(ctx, syscall.SIGKILL) != nil
	}
	return false
}

// remoteRe matches the ID: prefix of a sandbox path in fence cp.
var remoteRe = regexp.MustCompile(`^([a-z0-9]+):(.+)$`)

func splitRemote(s string) (id, p string, ok bool) {
	m := remoteRe.FindStringSubmatch(s)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

func cpCmd() *cobra.Command {
	var cf clientFlags
	var user string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file between the host and a sandbox",
		Long: `Copy one file into or out of a sandbox. Exactly one of SRC and DST is a
sandbox path, written ID:PATH. A sandbox PATH ending in / is a directory:
the file keeps its name. "-" as the host side is stdin or stdout.`,
		Example: `  fence cp ./data.csv $id:/home/user/data.csv
  fence cp $id:/home/user/out.png .
  tar c src | fence cp - $id:/tmp/src.tar`,
		Args: exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, srcPath, srcRemote := splitRemote(args[0])
			dstID, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return usagef("exactly one of SRC and DST must be a sandbox path (ID:PATH)")
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			id := srcID
			if dstRemote {
				id = dstID
			}
			d, err := c.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			e := c.Sandbox(id, d.EnvdAccessToken).Envd().WithUser(user)
			if dstRemote {
				return upload(cmd, e, args[0], dstPath)
			}
			return download(cmd, e, srcPath, args[1])
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user whose permissions apply in the sandbox")
	cf.add(cmd.Flags())
	return cmd
}

func upload(cmd *cobra.Command, e *client.Envd, local, remote string) error {
	var r io.Reader = cmd.InOrStdin()
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.IsDir() {
			return usagef("%s is a directory: fence cp copies one file", local)
		}
		r = f
		if strings.HasSuffix(remote, "/") {
			remote += filepath.Base(local)
		}
	}
	return e.WriteFile(cmd.Context(), remote, r)
}

func download(cmd *cobra.Command, e *client.Envd, remote, local string) error {
	rc, err := e.ReadFile(cmd.Context(), remote)
	if err != nil {
		return err
	}
	defer rc.Close()
	if local == "-" {
		_, err := io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, path.Base(remote))
	}
	f, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", local, err)
	}
	return f.Close()
}
