package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

func approvalsCmd() *cobra.Command {
	var (
		cf          clientFlags
		asJSON      bool
		interactive bool
		decision    string
	)
	cmd := &cobra.Command{
		Use:     "approvals [ID]",
		Aliases: []string{"approval"},
		Short:   "List, decide or answer one by one the egress approval requests of sandboxes created with network approval \"ask\"",
		Long: `A sandbox created with network {"approval": "ask"} that looks up a name
off its allowlist waits (fence serve --approval-timeout, default 1m) for a
decision: once (this connection), sandbox (add the name to the sandbox's
allowOut), team (refused until fence keeps team-wide names) or deny.

Without arguments this lists the pending requests. With ID and --decision it
decides one. With --interactive it asks y/n/s (once, deny, sandbox) for each
request as it arrives, until interrupted or stdin ends.`,
		Example: `  fence approvals
  fence approvals apr_0123456789abcdef --decision sandbox
  fence approvals --interactive`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			switch {
			case len(args) == 1:
				if decision == "" {
					return usagef("deciding %s needs --decision once|sandbox|team|deny", args[0])
				}
				r, err := c.DecideApproval(cmd.Context(), args[0], decision)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s for sandbox %s: %s\n", r.ID, r.Name, r.SandboxID, r.Decision)
				return nil
			case decision != "":
				return usagef("--decision needs a request ID")
			case interactive:
				return answerApprovals(cmd.Context(), c, cmd.InOrStdin(), cmd.OutOrStdout(), time.Second)
			}
			items, err := c.ListApprovals(cmd.Context())
			if err != nil {
				return err
			}
			return printApprovals(cmd.OutOrStdout(), items, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the API's approval requests)")
	cmd.Flags().BoolVarP(&interactive, "interactive", "i", false, "ask y/n/s for each request as it arrives")
	cmd.Flags().StringVar(&decision, "decision", "", "decide request ID: once, sandbox, team or deny")
	cf.add(cmd.Flags())
	return cmd
}

func printApprovals(w io.Writer, items []api.ApprovalRequest, asJSON bool) error {
	if asJSON {
		if items == nil {
			items = []api.ApprovalRequest{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(items)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSANDBOX\tNAME\tWAITS UNTIL")
	for _, r := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.ID, r.SandboxID, r.Name, r.Deadline.Local().Format(time.TimeOnly))
	}
	return tw.Flush()
}

// answerApprovals asks about each pending request, polling every poll,
// until ctx ends or in does.
func answerApprovals(ctx context.Context, c *client.Client, in io.Reader, out io.Writer, poll time.Duration) error {
	lines := bufio.NewScanner(in)
	asked := map[string]bool{}
	for {
		items, err := c.ListApprovals(ctx)
		if ctx.Err() != nil {
			return nil // interrupted
		}
		if err != nil {
			return err
		}
		for _, r := range items {
			if asked[r.ID] {
				continue
			}
			asked[r.ID] = true
			fmt.Fprintf(out, "sandbox %s wants to reach %s: allow? [y]es once, [s]andbox, [n]o: ", r.SandboxID, r.Name)
			if !lines.Scan() {
				return lines.Err()
			}
			d := map[string]string{"y": "once", "yes": "once", "s": "sandbox", "n": "deny", "no": "deny"}[strings.ToLower(strings.TrimSpace(lines.Text()))]
			if d == "" {
				fmt.Fprintln(out, "  not an answer: denied")
				d = "deny"
			}
			if _, err := c.DecideApproval(ctx, r.ID, d); ctx.Err() != nil {
				return nil
			} else if err != nil {
				fmt.Fprintf(out, "  %v\n", err)
				continue
			}
			fmt.Fprintf(out, "  %s\n", d)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(poll):
		}
	}
}
