package sudo

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const usage = `usage: sudo [-E] [-H] [-n] [-k] [-v] [-i | -s] [-u user] [--] command [args...]
fence's sudo runs the command through the sandbox's agent (no_new_privs
forbids setuid programs in fence sandboxes).`

// Main is `sudo` inside a sandbox (the fence binary run as "sudo"). It
// returns the exit code.
func Main(args []string, stdin, stdout, stderr *os.File) int {
	req, code, done := parseArgs(args, stderr)
	if done {
		return code
	}
	dir, err := os.Getwd()
	if err != nil {
		dir = "/"
	}
	req.Dir = dir
	code, err = run(req, stdin, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return code
}

// parseArgs reads sudo's options; done means exit with code at once.
func parseArgs(args []string, stderr io.Writer) (req *request, code int, done bool) {
	req = &request{}
	keepEnv := false
	for len(args) > 0 {
		a := args[0]
		if a == "--" {
			args = args[1:]
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			break
		}
		args = args[1:]
		for i := 1; i < len(a); i++ {
			switch c := a[i]; c {
			case 'E':
				keepEnv = true
			case 'H', 'n', 'S', 'P':
				// HOME is always the target's; nothing here asks for a
				// password.
			case 'k', 'K', 'v':
				if len(args) == 0 && i == len(a)-1 {
					return nil, 0, true // credential cache: nothing to do
				}
			case 'i':
				req.Login = true
			case 's':
				req.Shell = true
			case 'u':
				v := a[i+1:]
				if v == "" {
					if len(args) == 0 {
						fmt.Fprintln(stderr, "sudo: option requires an argument -- 'u'\n"+usage)
						return nil, 1, true
					}
					v, args = args[0], args[1:]
				}
				req.User = strings.TrimPrefix(v, "#")
				i = len(a)
			case 'h':
				fmt.Fprintln(stderr, usage)
				return nil, 0, true
			default:
				fmt.Fprintf(stderr, "sudo: invalid option -- '%c'\n%s\n", c, usage)
				return nil, 1, true
			}
		}
	}
	req.Argv = args
	if len(req.Argv) == 0 && !req.Login && !req.Shell {
		fmt.Fprintln(stderr, usage)
		return nil, 1, true
	}
	req.Env = map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if keepEnv || k == "TERM" || k == "LANG" || k == "LANGUAGE" || k == "COLORTERM" || strings.HasPrefix(k, "LC_") {
			req.Env[k] = v
		}
	}
	return req, 0, false
}

func run(req *request, stdin, stdout, stderr *os.File) (int, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: SocketPath, Net: "unix"})
	if err != nil {
		return 1, fmt.Errorf("sudo: the sandbox agent does not answer: %w", err)
	}
	defer c.Close()
	b, err := encodeRequest(req)
	if err != nil {
		return 1, fmt.Errorf("sudo: %w", err)
	}
	rights := unix.UnixRights(int(stdin.Fd()), int(stdout.Fd()), int(stderr.Fd()))
	n, _, err := c.WriteMsgUnix(b, rights, nil)
	if err == nil && n < len(b) {
		_, err = c.Write(b[n:]) // a stream may take the request in parts
	}
	if err != nil {
		return 1, fmt.Errorf("sudo: %w", err)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			writeMsg(c, msgSignal, int32(s.(syscall.Signal)))
		}
	}()
	kind, v, err := readMsg(c)
	if err != nil {
		return 1, errors.New("sudo: the sandbox agent went away")
	}
	switch kind {
	case msgExit:
		return int(v), nil
	case msgKilled:
		return 128 + int(v), nil
	case msgError:
		msg := make([]byte, max(0, min(int(v), 4096)))
		n, _ := io.ReadFull(c, msg)
		return 1, errors.New(string(msg[:n]))
	}
	return 1, fmt.Errorf("sudo: unexpected answer %q", kind)
}
