package cli

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/api"
)

// DefaultSSHPort is the port `fence ssh` connects to.
const DefaultSSHPort = 2222

// sshArgs is the system ssh's argv (after "ssh") that reaches sandbox id
// on the daemon at daemonURL's host, port port, with extra after the
// destination (ssh reads options there too, then the command).
func sshArgs(daemonURL, id string, port int, extra []string) ([]string, error) {
	if !api.ValidSandboxID(id) {
		return nil, usagef("%q is not a sandbox ID", id)
	}
	u, err := url.Parse(daemonURL)
	if err != nil || u.Hostname() == "" {
		return nil, usagef("daemon URL %q has no host", daemonURL)
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return append([]string{"-p", strconv.Itoa(port), id + "@" + host}, extra...), nil
}

func sshCmd() *cobra.Command {
	var (
		daemonURL string
		port      int
	)
	cmd := &cobra.Command{
		Use:   "ssh [flags] ID [-- [SSH-OPTIONS...] [CMD...]]",
		Short: "SSH into a sandbox through the daemon's SSH server",
		Long: `Run the system's ssh to the sandbox ID through the SSH server of the daemon
(fence serve --ssh-addr). Authentication is ssh's own: a public key registered
with POST /ssh-keys, or the API key as the password. Arguments after -- go to
ssh after the destination: its options, then a command. ssh's exit code is
fence's.`,
		Example: `  fence ssh $id
  fence ssh $id -- -L 8000:localhost:8000 -N
  fence ssh --port 2222 $id -- -i ~/.ssh/fence_ed25519 uname -a`,
		Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			u := daemonURL
			if u == "" {
				u = os.Getenv("FENCE_URL")
			}
			if u == "" {
				u = DefaultURL
			}
			argv, err := sshArgs(u, args[0], port, args[1:])
			if err != nil {
				return err
			}
			bin, err := exec.LookPath("ssh")
			if err != nil {
				return fmt.Errorf("no ssh client here (install openssh-client): %w", err)
			}
			c := exec.CommandContext(cmd.Context(), bin, argv...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
			if err := c.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return &ExitError{Code: ee.ExitCode()}
				}
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&daemonURL, "url", "", "daemon URL, whose host ssh connects to (default $FENCE_URL, else "+DefaultURL+")")
	cmd.Flags().IntVar(&port, "port", DefaultSSHPort, "the daemon's SSH port (fence serve --ssh-addr)")
	return cmd
}
