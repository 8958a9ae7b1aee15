package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/tbuild"
)

// dockerfileFlags are the flags of `fence template build NAME -f
// Dockerfile`, a build through a daemon's template API.
type dockerfileFlags struct {
	file, context string
	tags          []string
	noCache       bool
	cf            clientFlags
}

func (d *dockerfileFlags) add(fs *pflag.FlagSet) {
	fs.StringVarP(&d.file, "file", "f", "", "build NAME from this Dockerfile through the daemon (fenced build steps)")
	fs.StringVar(&d.context, "context", "", "build context directory COPY reads from (default: the Dockerfile's directory)")
	fs.StringSliceVar(&d.tags, "tag", nil, "tags of the build (default: \"default\")")
	fs.BoolVar(&d.noCache, "no-cache", false, "run every step again instead of using cached layers")
	fs.StringVar(&d.cf.url, "url", "", "daemon URL (default $FENCE_URL, else "+DefaultURL+")")
	fs.StringVar(&d.cf.apiKey, "api-key", "", "API key (default $FENCE_API_KEY, else read from DATA-DIR/api-key)")
}

// buildDockerfile builds template name from a Dockerfile through the
// daemon, printing the build log: with step numbers and elapsed times on
// a terminal, plain lines otherwise.
func buildDockerfile(ctx context.Context, d *dockerfileFlags, dataDir, name string, stdout, stderr io.Writer) error {
	d.cf.dataDir = dataDir
	content, err := os.ReadFile(d.file)
	if err != nil {
		return fmt.Errorf("reading Dockerfile: %w", err)
	}
	df, err := tbuild.ParseDockerfile(string(content))
	if err != nil {
		return usagef("%s: %v", d.file, strings.TrimSuffix(err.Error(), ": invalid argument"))
	}
	dir := d.context
	if dir == "" {
		dir = filepath.Dir(d.file)
	}
	c, err := d.cf.client()
	if err != nil {
		return err
	}
	reg, err := c.RegisterTemplate(ctx, name, d.tags)
	if err != nil {
		return fmt.Errorf("registering build of %s: %w", name, err)
	}
	spec := client.TemplateBuildSpec{FromImage: df.FromImage, StartCmd: df.StartCmd, ReadyCmd: df.ReadyCmd, Force: d.noCache}
	for _, st := range df.Steps {
		cs := client.TemplateStep{Type: st.Type, Args: st.Args, Force: d.noCache}
		if st.Type == "COPY" {
			hash, err := uploadContext(ctx, c, reg.TemplateID, dir, st.Args[0], st.Args[1])
			if err != nil {
				return err
			}
			cs.FilesHash = hash
		}
		spec.Steps = append(spec.Steps, cs)
	}
	if err := c.TriggerTemplateBuild(ctx, reg.TemplateID, reg.BuildID, spec); err != nil {
		return fmt.Errorf("starting build of %s: %w", name, err)
	}
	if err := followBuild(ctx, c, name, reg.TemplateID, reg.BuildID, stderr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\t%s\t%s\n", name, reg.TemplateID, reg.BuildID)
	return nil
}

// followBuild prints the build's log (but its debug lines) to stderr until
// the build ends, and returns its failure.
func followBuild(ctx context.Context, c *client.Client, name, templateID, buildID string, stderr io.Writer) error {
	tty := false
	if f, ok := stderr.(*os.File); ok {
		tty = isTerminal(int(f.Fd()))
	}
	start := time.Now()
	offset := 0
	for {
		st, err := c.TemplateBuildStatus(ctx, templateID, buildID, offset)
		if err != nil {
			return fmt.Errorf("following build of %s: %w", name, err)
		}
		for _, e := range st.LogEntries {
			if e.Level == "debug" {
				continue
			}
			if tty {
				fmt.Fprintf(stderr, "\x1b[2m%7.1fs\x1b[0m %s\n", time.Since(start).Seconds(), e.Message)
			} else {
				fmt.Fprintf(stderr, "%s %s %s\n", e.Timestamp.Format(time.RFC3339), e.Level, e.Message)
			}
		}
		offset += len(st.LogEntries)
		if (st.Status == "ready" || st.Status == "error") && len(st.LogEntries) == 0 {
			if st.Status == "error" {
				msg := "unknown error"
				if st.Reason != nil {
					msg = st.Reason.Message
					if st.Reason.Step != "" {
						msg = "step " + st.Reason.Step + ": " + msg
					}
				}
				return fmt.Errorf("building %s: %s", name, msg)
			}
			return nil
		}
		if len(st.LogEntries) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// uploadContext archives what COPY src takes from dir and uploads it.
func uploadContext(ctx context.Context, c *client.Client, templateID, dir, src, dest string) (string, error) {
	f, err := os.CreateTemp("", "fence-context-*.tar.gz")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	hash, err := tbuild.ContextArchive(dir, src, dest, f)
	if err != nil {
		return "", usagef("%v", err)
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	if _, err := c.UploadTemplateFiles(ctx, templateID, hash, f, size, false); err != nil {
		return "", fmt.Errorf("uploading COPY %s: %w", src, err)
	}
	return hash, nil
}

func templateListCmd() *cobra.Command {
	var cf clientFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the templates built through the daemon",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			items, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(items)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTEMPLATE ID\tSTATUS\tBUILDS\tUPDATED")
			for _, t := range items {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", strings.Join(t.Aliases, ","), t.TemplateID, t.BuildStatus, t.BuildCount,
					t.UpdatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cf.add(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func templateRmCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "rm NAME|ID",
		Short: "Delete a template built through the daemon (every tag)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			return c.DeleteTemplate(cmd.Context(), args[0])
		},
	}
	cf.add(cmd.Flags())
	return cmd
}

func templateTagsCmd() *cobra.Command {
	var cf clientFlags
	var add, remove []string
	cmd := &cobra.Command{
		Use:   "tags NAME[:TAG]",
		Short: "List a template's tags, or point tags at a build (--add) or remove them (--rm)",
		Example: `  fence template tags myapp
  fence template tags myapp:v2 --add prod
  fence template tags myapp --rm prod`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			if len(add) > 0 && len(remove) > 0 {
				return usagef("--add and --rm do not go together")
			}
			switch {
			case len(add) > 0:
				return c.AssignTemplateTags(cmd.Context(), args[0], add)
			case len(remove) > 0:
				return c.RemoveTemplateTags(cmd.Context(), args[0], remove)
			}
			tags, err := c.TemplateTags(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TAG\tBUILD ID\tCREATED")
			for _, t := range tags {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Tag, t.BuildID, t.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cf.add(cmd.Flags())
	cmd.Flags().StringSliceVar(&add, "add", nil, "tags to point at the build NAME[:TAG] names")
	cmd.Flags().StringSliceVar(&remove, "rm", nil, "tags to remove")
	return cmd
}
