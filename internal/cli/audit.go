package cli

import (
	"bufio"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/internal/audit"
)

func auditCmd() *cobra.Command {
	group := groupCmd("audit", "Verify and export the daemon's audit trail")
	group.Long = `The daemon keeps an audit trail in DATA-DIR/audit: one hash-chained JSON
line per thing it saw (API calls, sandbox lifecycle, processes, file writes,
egress and gateway decisions), with checkpoints signed by the key in
DATA-DIR/audit-key. These verbs read the files directly: they work with the
daemon stopped, and while it runs.`
	group.AddCommand(auditVerifyCmd(), auditExportCmd())
	return group
}

func auditVerifyCmd() *cobra.Command {
	var dataDir, pub string
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check that the audit trail is intact",
		Long: `Check every record of the audit trail: well-formed, seqs contiguous, each
record's prev the hash of the one before, every checkpoint signed by the
public key (DATA-DIR/audit.pub unless --pub names a copy kept elsewhere,
which is the one to trust), and the log reaching its last recorded
checkpoint.

Exit status 0 when intact (with a summary, and warnings such as records
after the last checkpoint, which no signature covers yet); 1 with the first
broken record (segment, line, seq and why).`,
		Example: `  fence audit verify
  fence audit verify --pub /mnt/offhost/audit.pub`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if pub == "" {
				pub = filepath.Join(dataDir, audit.PubFile)
			}
			key, err := audit.LoadPublicKey(pub)
			if err != nil {
				return fmt.Errorf("reading the public key: %w", err)
			}
			rep, err := audit.Verify(dataDir, key)
			var brk *audit.Break
			if errors.As(err, &brk) {
				fmt.Fprintf(cmd.OutOrStdout(), "BROKEN: segment %s line %d seq %d: %s\n", brk.Segment, brk.Line, brk.Seq, brk.Reason)
				return &ExitError{Code: 1}
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if rep.Records == 0 {
				fmt.Fprintln(out, "intact: no records yet")
			} else {
				fmt.Fprintf(out, "intact: %d records (seq %d to %d) in %d segments, %d checkpoints, the last at seq %d\n",
					rep.Records, rep.FirstSeq, rep.LastSeq, rep.Segments, rep.Checkpoints, rep.LastCheckpoint)
			}
			for _, w := range rep.Warnings {
				fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dataDir, "data-dir", DefaultDataDir, "the daemon's data directory")
	fs.StringVar(&pub, "pub", "", "the public key to check checkpoints with (default DATA-DIR/audit.pub)")
	return cmd
}

func auditExportCmd() *cobra.Command {
	var (
		dataDir, sandbox, since, until string
		types                          []string
		after                          uint64
		limit                          int
	)
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Print audit records as JSON lines",
		Long: `Print the audit records that match, oldest first, one JSON line each,
exactly as stored (so an export re-verifies line by line).`,
		Example: `  fence audit export --sandbox i1a2b3c4d5e6f7g8h9j0
  fence audit export --since 1h --type egress.flow,gateway.request
  fence audit export --since 2026-01-02T15:04:05Z --until 2026-01-03T00:00:00Z`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f := audit.Filter{Sandbox: sandbox, After: after, Limit: limit}
			var err error
			if f.Since, err = parseWhen(since); err != nil {
				return usagef("--since: %v", err)
			}
			if f.Until, err = parseWhen(until); err != nil {
				return usagef("--until: %v", err)
			}
			for _, t := range types {
				for p := range strings.SplitSeq(t, ",") {
					if p = strings.TrimSpace(p); p != "" {
						f.Types = append(f.Types, p)
					}
				}
			}
			w := bufio.NewWriterSize(cmd.OutOrStdout(), 256<<10)
			err = audit.Export(cmd.Context(), dataDir, f, func(_ *audit.Record, line []byte) error {
				w.Write(line)
				return w.WriteByte('\n')
			})
			if ferr := w.Flush(); err == nil {
				err = ferr
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dataDir, "data-dir", DefaultDataDir, "the daemon's data directory")
	fs.StringVar(&sandbox, "sandbox", "", "only the records of this sandbox")
	fs.StringVar(&since, "since", "", "only records at or after this time (RFC 3339, or a duration back from now: 1h)")
	fs.StringVar(&until, "until", "", "only records at or before this time (same forms)")
	fs.StringSliceVar(&types, "type", nil, "only records of these types (comma-separated, repeatable)")
	fs.Uint64Var(&after, "after", 0, "only records after this seq")
	fs.IntVar(&limit, "limit", 0, "at most this many records (0: all)")
	return cmd
}

// parseWhen reads an RFC 3339 time or a duration back from now; "" is the
// zero time.
func parseWhen(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration", s)
	}
	return time.Now().Add(-d), nil
}
