package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func sandboxExportCmd() *cobra.Command {
	var (
		cf  clientFlags
		out string
	)
	cmd := &cobra.Command{
		Use:   "export ID [-o FILE]",
		Short: "Write a sandbox's forensics archive (tar.gz)",
		Long: `Write what fence can show of a sandbox as a tar.gz: changes/ (its files
changed against its template; symlinks as symlinks, never followed; deleted
paths listed in changes/.whiteouts), metadata.json (its record), audit.jsonl
(its audit records) and usage.json. Works for running and paused sandboxes,
and for killed ones while the daemon keeps them (fence serve
--forensics-retention, 24h by default; the audit trail's retention for the
records). The file is written 0600 and only complete: an archive cut short
is removed and the command fails.`,
		Example: `  fence sandbox export 8f2kq0x1m3 -o 8f2kq0x1m3.tar.gz
  fence sandbox export 8f2kq0x1m3 | tar -tzv`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			if out == "" || out == "-" {
				_, err := c.Export(cmd.Context(), args[0], cmd.OutOrStdout())
				return err
			}
			// A temporary file beside the target, renamed once whole.
			f, err := os.CreateTemp(filepath.Dir(out), ".fence-export-*")
			if err != nil {
				return fmt.Errorf("creating %s: %w", out, err)
			}
			ok := false
			defer func() {
				if !ok {
					f.Close()
					os.Remove(f.Name())
				}
			}()
			if _, err := c.Export(cmd.Context(), args[0], f); err != nil {
				return err
			}
			if err := f.Sync(); err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			if st, err := os.Lstat(out); err == nil && !st.Mode().IsRegular() {
				return fmt.Errorf("%s exists and is not a regular file", out)
			} else if err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			if err := unix.Rename(f.Name(), out); err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			ok = true
			return nil
		},
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (default: standard output)")
	return cmd
}
