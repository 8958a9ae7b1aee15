package cli

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/selftest"
	"github.com/fencesandbox/fence/internal/selftest/probe"
)

func selftestCmd(deps Deps) *cobra.Command {
	var (
		o        LocalOptions
		tdir     string
		jsonOut  bool
		template string
	)
	cmd := &cobra.Command{
		Use:   "selftest",
		Short: "Attack a sandbox on this machine and report what it refused",
		Long: `Start a sandbox on this machine exactly as 'fence run' does (no daemon,
'fence run's default limits, the minimal template unless --template names
another), run fence's attack probes inside it as the sandbox's root, and
print one line per check:

  PASS NAME — what the pass proves
  FAIL NAME — what went wrong

and a summary "N passed, M failed". Each probe is the fence binary itself in
a hidden role ('fence probe CHECK'), the same code fence's own tests attack
sandboxes with. Network checks also need fence's side of the story: a
connection must have been refused by fence's policy (on record in the
sandbox's network stack), not merely have failed, and nothing may reach a
listener this command opens on every host address. The sandbox is removed
at the end; it takes a few seconds to half a minute (the limit checks fill
the sandbox's memory and process table).

What is checked:
` + checkList() + `
What a FAIL means: on this machine, with this fence binary and kernel, the
sandbox did not refuse that attack (or the probe could not carry it out,
which proves nothing either). Treat it as a security problem: do not run
untrusted code with fence here until it is understood, and report it as
SECURITY.md describes, with the full output of 'fence selftest --json'.

Exit status: 0 when every check passed, 1 when any failed, 2 when the
sandbox could not be started (not root, template not built, …).`,
		Example: `  # Check this machine with the minimal template
  sudo fence selftest

  # Check the base template, as JSON for a bug report
  sudo fence selftest --template base --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if deps.NewLocal == nil {
				return errUnavailable("fence selftest")
			}
			o.Template = template
			o.TemplatesDir = templatesDir(tdir, o.DataDir)
			return runSelftest(cmd, deps.NewLocal, o, jsonOut)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&template, "template", "minimal", "template the sandbox starts from")
	fs.StringVar(&o.DataDir, "data-dir", DefaultDataDir, "directory for fence's state")
	fs.StringVar(&tdir, "templates-dir", "", "directory of built templates (default DATA-DIR/templates)")
	fs.BoolVar(&jsonOut, "json", false, "print the report as JSON instead of lines")
	return cmd
}

// checkList describes every check for --help, grouped by layer.
func checkList() string {
	var b strings.Builder
	group := ""
	for _, c := range probe.Checks() {
		if c.Group != group {
			group = c.Group
			fmt.Fprintf(&b, "\n  %s:\n", group)
		}
		b.WriteString(wrap("    "+c.Name+" — "+c.Proves, "      ", 78))
	}
	return b.String()
}

// wrap breaks s into lines of at most width columns, indenting the
// continuation lines.
func wrap(s, indent string, width int) string {
	var b strings.Builder
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len([]rune(line))+1+len([]rune(w)) > width {
			b.WriteString(line + "\n")
			line = indent + w
			continue
		}
		if line == "" {
			line = strings.Repeat(" ", len(s)-len(strings.TrimLeft(s, " "))) + w
		} else {
			line += " " + w
		}
	}
	return b.String() + line + "\n"
}

// selftestSetupError reports what kept the selftest from running (exit 2).
func selftestSetupError(cmd *cobra.Command, format string, args ...any) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "fence: selftest: "+format+"\n", args...)
	return &ExitError{Code: 2}
}

func runSelftest(cmd *cobra.Command, newLocal func(context.Context, LocalOptions) (isolation.Sandbox, error), o LocalOptions, jsonOut bool) error {
	if os.Geteuid() != 0 {
		return selftestSetupError(cmd, "must run as root: like 'fence run', it creates the sandbox's namespaces, cgroups and mounts itself (try: sudo fence selftest)")
	}
	ctx := cmd.Context()
	flows := selftest.NewFlowLog()
	o.Limits = defaultLimits()
	o.OnFlow = flows.Record
	sb, err := newLocal(ctx, o)
	if err != nil {
		return selftestSetupError(cmd, "starting a sandbox from template %q: %v", o.Template, err)
	}
	exec, closeExec := selftest.AgentExec(sb.DialAgent)
	defer func() {
		closeExec()
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
		defer cancel()
		if err := sb.Kill(kctx); err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "fence: selftest: removing the sandbox: %v\n", err)
		}
	}()
	out := cmd.OutOrStdout()
	opts := selftest.Options{
		Exec: exec, MemoryBytes: o.Limits.MemoryBytes, Pids: o.Limits.Pids, Flows: flows,
	}
	if !jsonOut {
		opts.OnResult = func(r selftest.Result) { fmt.Fprintln(out, r) }
	}
	rep, err := selftest.Run(ctx, opts)
	if err != nil {
		return selftestSetupError(cmd, "%v", err)
	}
	return reportSelftest(cmd, rep, jsonOut)
}

// reportSelftest finishes the report (the summary line, or the whole JSON
// document) and turns it into the exit status.
func reportSelftest(cmd *cobra.Command, rep selftest.Report, jsonOut bool) error {
	out := cmd.OutOrStdout()
	var err error
	if jsonOut {
		err = rep.WriteJSON(out)
	} else {
		_, err = fmt.Fprintln(out, rep.Summary())
	}
	if err != nil {
		return err
	}
	if !rep.OK() {
		return &ExitError{Code: 1}
	}
	return nil
}

func probeCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "probe CHECK [ARG...]",
		Short:              "Run one attack probe inside a sandbox (internal, used by fence selftest)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := probe.Main(args, cmd.OutOrStdout()); code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
}
