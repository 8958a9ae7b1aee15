package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// maxSecretValue is the daemon's cap on a value; one more byte is read so
// that a longer one is an error, not cut.
const maxSecretValue = 64 << 10

func secretCmd() *cobra.Command {
	group := groupCmd("secret", "Store secrets the egress gateway puts into sandboxes' requests")
	group.Aliases = []string{"secrets"}
	group.Long = `Store secrets on the daemon. A secret's value never enters a sandbox: a
sandbox sends a placeholder (${e2b.secrets.NAME}, as the E2B SDK's
Secret.fill makes it), and the daemon's egress gateway puts the value into
the request on its way out, to the hosts the sandbox's rules name. A
create's "secrets" bindings name hosts as HOST or HOST:PORT (without a
port: 443).

Values are write-only: no command and no API route ever prints one. Values
are read from stdin or a file, never from the command line (where other
users and the shell history would see them).`
	group.AddCommand(secretCreateCmd(), secretUpdateCmd(), secretListCmd(), secretGetCmd(), secretDeleteCmd())
	return group
}

// secretValue opens secret create and update: the client, and the value
// read as readSecretValue reads it.
func (f *clientFlags) secretValue(cmd *cobra.Command, name, file string, keepNewline bool) (*client.Client, string, error) {
	c, err := f.client()
	if err != nil {
		return nil, "", err
	}
	value, err := readSecretValue(cmd, name, file, keepNewline)
	if err != nil {
		return nil, "", err
	}
	return c, value, nil
}

// readSecretValue reads a value from file ("" means stdin; "-" too). On
// a terminal it prompts without echo. One trailing newline is dropped
// unless keepNewline.
func readSecretValue(cmd *cobra.Command, name, file string, keepNewline bool) (string, error) {
	var r io.Reader = cmd.InOrStdin()
	if file != "" && file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	} else if f, ok := r.(*os.File); ok && isTerminal(int(f.Fd())) {
		v, err := promptHidden(cmd, f, name)
		if err != nil {
			return "", err
		}
		return v, nil
	}
	b, err := io.ReadAll(io.LimitReader(r, maxSecretValue+2))
	if err != nil {
		return "", fmt.Errorf("reading the value: %w", err)
	}
	if !keepNewline {
		b = bytes.TrimSuffix(b, []byte("\n"))
		b = bytes.TrimSuffix(b, []byte("\r"))
	}
	if len(b) == 0 {
		return "", usagef("the value is empty: pipe it on stdin or pass --value-file")
	}
	if len(b) > maxSecretValue {
		return "", usagef("the value is larger than %d bytes", maxSecretValue)
	}
	return string(b), nil
}

// promptHidden reads one line from the terminal f with echo off.
func promptHidden(cmd *cobra.Command, f *os.File, name string) (string, error) {
	fd := int(f.Fd())
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return "", err
	}
	saved := *t
	t.Lflag &^= unix.ECHO
	t.Lflag |= unix.ICANON | unix.ECHONL
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, t); err != nil {
		return "", err
	}
	defer unix.IoctlSetTermios(fd, unix.TCSETS, &saved)
	fmt.Fprintf(cmd.ErrOrStderr(), "Value of secret %s (not shown): ", name)
	var line []byte
	buf := make([]byte, 1)
	for len(line) <= maxSecretValue {
		n, err := f.Read(buf)
		if n == 1 {
			if buf[0] == '\n' {
				break
			}
			line = append(line, buf[0])
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return "", err
		}
	}
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		return "", usagef("the value is empty")
	}
	if len(line) > maxSecretValue {
		return "", usagef("the value is larger than %d bytes", maxSecretValue)
	}
	return string(line), nil
}

func secretCreateCmd() *cobra.Command {
	var (
		cf          clientFlags
		valueFile   string
		keepNewline bool
		metadata    []string
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Store a new secret; the value comes from stdin or --value-file",
		Long: `Store a new secret named NAME (letters, digits, _ and -, up to 128; stored in
lower case; not starting with sec_) and print its ID. The value (up to 64 KiB)
is read from stdin, or from --value-file; on a terminal it is asked for
without echo. One trailing newline is dropped unless --keep-newline.`,
		Example: `  # From a password manager, a file, or typed at the prompt
  pass show openai | fence secret create openai-key
  fence secret create gh-token --value-file ~/.config/gh-token --metadata owner=ci
  fence secret create npm-token

  # Then, in a sandbox's network rules (E2B SDK):
  #   rules: {'api.openai.com': [{transform: {headers:
  #     {Authorization: 'Bearer ' + Secret.fill('openai-key')}}}]}`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parsePairs("metadata", metadata)
			if err != nil {
				return err
			}
			c, value, err := cf.secretValue(cmd, args[0], valueFile, keepNewline)
			if err != nil {
				return err
			}
			s, err := c.CreateSecret(cmd.Context(), args[0], value, md)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.SecretID)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&valueFile, "value-file", "", "read the value from this file instead of stdin")
	fs.BoolVar(&keepNewline, "keep-newline", false, "keep a trailing newline of the value")
	fs.StringArrayVar(&metadata, "metadata", nil, "metadata KEY=VALUE (repeatable; up to 32)")
	cf.add(fs)
	return cmd
}

func secretUpdateCmd() *cobra.Command {
	var (
		cf            clientFlags
		valueFile     string
		keepNewline   bool
		metadata      []string
		clearMetadata bool
	)
	cmd := &cobra.Command{
		Use:   "update NAME|ID",
		Short: "Store a new version of a secret's value",
		Long: `Store a new value for a secret, as its next version. Sandboxes' requests get
the new value from their next request on. Metadata is kept unless --metadata
or --clear-metadata replaces it.`,
		Example: `  pass show openai | fence secret update openai-key
  fence secret update sec_01jd9v0m6nf2ms3t8k4xq7w5yz --value-file new-token --clear-metadata`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parsePairs("metadata", metadata)
			if err != nil {
				return err
			}
			if clearMetadata {
				if md != nil {
					return usagef("--metadata and --clear-metadata exclude each other")
				}
				md = map[string]string{}
			}
			c, value, err := cf.secretValue(cmd, args[0], valueFile, keepNewline)
			if err != nil {
				return err
			}
			s, err := c.UpdateSecret(cmd.Context(), args[0], value, md)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s version %d\n", s.SecretID, s.CurrentVersion)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&valueFile, "value-file", "", "read the value from this file instead of stdin")
	fs.BoolVar(&keepNewline, "keep-newline", false, "keep a trailing newline of the value")
	fs.StringArrayVar(&metadata, "metadata", nil, "replace the metadata with KEY=VALUE pairs (repeatable)")
	fs.BoolVar(&clearMetadata, "clear-metadata", false, "remove all metadata")
	cf.add(fs)
	return cmd
}

func secretListCmd() *cobra.Command {
	var (
		cf     clientFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List secrets (never their values)",
		Example: `  fence secret list
  fence secret list --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			items, err := c.ListSecrets(cmd.Context())
			if err != nil {
				return err
			}
			return printSecrets(cmd.OutOrStdout(), items, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the API's Secret objects)")
	cf.add(cmd.Flags())
	return cmd
}

func secretGetCmd() *cobra.Command {
	var (
		cf     clientFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "get NAME|ID",
		Short: "Show a secret's ID, version and metadata (never its value)",
		Example: `  fence secret get openai-key
  fence secret get sec_01jd9v0m6nf2ms3t8k4xq7w5yz --json`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			s, err := c.GetSecret(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printSecrets(cmd.OutOrStdout(), []api.Secret{*s}, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the API's Secret object, in a list)")
	cf.add(cmd.Flags())
	return cmd
}

func secretDeleteCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "delete NAME|ID...",
		Aliases: []string{"rm"},
		Short:   "Delete secrets, all their versions with them",
		Long: `Delete secrets. Requests of running sandboxes that name a deleted secret
are refused by the egress gateway from then on.`,
		Example: `  fence secret delete openai-key gh-token`,
		Args:    minArgs(1),
		RunE:    cf.eachArg((*client.Client).DeleteSecret),
	}
	cf.add(cmd.Flags())
	return cmd
}

func printSecrets(w io.Writer, items []api.Secret, asJSON bool) error {
	if asJSON {
		if items == nil {
			items = []api.Secret{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(items)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tVERSION\tUPDATED\tMETADATA")
	for _, s := range items {
		keys := make([]string, 0, len(s.Metadata))
		for k := range s.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([]string, 0, len(keys))
		for _, k := range keys {
			pairs = append(pairs, k+"="+s.Metadata[k])
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.SecretID, s.Name, s.CurrentVersion,
			s.UpdatedAt.UTC().Format(time.RFC3339), strings.Join(pairs, ","))
	}
	return tw.Flush()
}

func sandboxDownloadsCmd() *cobra.Command {
	var (
		cf     clientFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "downloads ID",
		Short: "List the packages a sandbox downloaded through the egress gateway",
		Long: `List the package artifacts (PyPI, npm, Debian, Go, crates, GitHub releases) a
sandbox fetched through the egress gateway, oldest first, with their size and
SHA-256 as delivered. The record outlives the sandbox: it is kept for 7 days,
and the newest 10,000 per sandbox.`,
		Example: `  fence sandbox downloads 8f2kq0x1m3
  fence sandbox downloads 8f2kq0x1m3 --json | jq -r '.[] | "\(.sha256)  \(.name)"'`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			items, err := c.Downloads(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if asJSON {
				if items == nil {
					items = []api.Download{}
				}
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(items)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tECOSYSTEM\tNAME\tVERSION\tSIZE\tSHA256\tURL")
			for _, d := range items {
				sum := d.SHA256
				if len(sum) > 16 {
					sum = sum[:16] + "…"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Time.UTC().Format(time.RFC3339), d.Ecosystem,
					d.Name, d.Version, d.Size, sum, d.URL)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (full SHA-256 digests)")
	cf.add(cmd.Flags())
	return cmd
}
