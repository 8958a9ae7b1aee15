package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/api"
)

// The checkpoint, checkpoints, diff and rewind verbs of `fence sandbox`.
func sandboxLayerCmds() []*cobra.Command {
	return []*cobra.Command{sandboxCheckpointCmd(), sandboxCheckpointsCmd(), sandboxDiffCmd(), sandboxRewindCmd()}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func sandboxCheckpointCmd() *cobra.Command {
	var (
		cf     clientFlags
		name   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "checkpoint ID",
		Short: "Checkpoint a sandbox's filesystem and print the checkpoint's ID",
		Example: `  cp=$(fence sandbox checkpoint $id --name before-install)
  fence exec $id -- sh -c 'rm -rf /home/user/project'
  fence sandbox diff $id --from $cp
  fence sandbox rewind $id $cp`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			cp, err := c.Checkpoint(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), cp)
			}
			fmt.Fprintln(cmd.OutOrStdout(), cp.CheckpointID)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&name, "name", "", "a name the checkpoint can be named by in diff and rewind")
	fs.BoolVar(&asJSON, "json", false, "print the checkpoint as JSON")
	cf.add(fs)
	return cmd
}

func sandboxCheckpointsCmd() *cobra.Command {
	var (
		cf     clientFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "checkpoints ID",
		Short: "List a sandbox's checkpoints, oldest first",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			cps, err := c.Checkpoints(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				if cps == nil {
					cps = []api.Checkpoint{}
				}
				return printJSON(cmd.OutOrStdout(), cps)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tAUTO\tFILES\tBYTES\tCREATED")
			for _, c := range cps {
				fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%d\t%s\n", c.CheckpointID, c.Name, c.Auto, c.Files, c.Bytes, c.CreatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cf.add(cmd.Flags())
	return cmd
}

func sandboxDiffCmd() *cobra.Command {
	var (
		cf       clientFlags
		from, to string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "diff ID",
		Short: "List the paths added, changed or removed between two states of a sandbox",
		Long: `diff lists what differs between two states of a sandbox's filesystem: --from
(a checkpoint's ID or name; default: as the sandbox was created) and --to (a
checkpoint; default: as it is now). Each line is the change (A added, M
changed, D removed), the size, the sha256 of a file's content, and the path.`,
		Example: `  fence sandbox diff $id                      # everything since create
  fence sandbox diff $id --from before-install # since a checkpoint`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			d, err := c.Diff(cmd.Context(), args[0], from, to)
			if err != nil {
				return err
			}
			if asJSON {
				if d == nil {
					d = []api.FileDiff{}
				}
				return printJSON(cmd.OutOrStdout(), d)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, f := range d {
				mark := map[string]string{"added": "A", "changed": "M", "removed": "D"}[f.Change]
				sum := f.SHA256
				if len(sum) > 12 {
					sum = sum[:12]
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", mark, f.Size, sum, quotePath(f.Path))
			}
			return tw.Flush()
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&from, "from", "", "checkpoint ID or name to compare from (default: as created)")
	fs.StringVar(&to, "to", "", "checkpoint ID or name to compare to (default: now)")
	fs.BoolVar(&asJSON, "json", false, "print JSON (full hashes, modes, old sizes and hashes)")
	cf.add(fs)
	return cmd
}

// quotePath shows a path with control characters quoted, so that a file
// name cannot forge lines or escape sequences on the terminal.
func quotePath(p string) string {
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return fmt.Sprintf("%q", p)
		}
	}
	return p
}

func sandboxRewindCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "rewind ID CHECKPOINT",
		Short: "Reboot a sandbox on one of its checkpoints (its processes start anew)",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			return c.Rewind(cmd.Context(), args[0], args[1])
		},
	}
	cf.add(cmd.Flags())
	return cmd
}
