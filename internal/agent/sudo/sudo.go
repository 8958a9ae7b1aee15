// Package sudo gives sandbox users sudo although every sandbox process
// runs with no_new_privs, under which a setuid sudo cannot work.
//
// The agent (root in the sandbox) serves a unix socket; `sudo` inside the
// sandbox is the fence binary, which sends the command, its working
// directory and its stdio descriptors there. The agent checks who is
// asking (SO_PEERCRED, not anything the caller says), runs the command as
// the target user with the caller's descriptors, relays the signals the
// caller forwards, and answers with the exit status.
//
// # Security
//
// It grants what the template's sudo configuration grants and nothing
// more: root may run anything, and another user only if it is in the
// "sudo" group or has a file of its name in /etc/sudoers.d (as the base
// template's `user` has, passwordless, like E2B's). It works only inside
// the sandbox: root there is an unprivileged user on the host, and the
// sandbox's security rests on the namespaces, the seccomp filter and the
// bounded capabilities, which a process started this way has too.
// It does not parse sudoers rules beyond that, ask for passwords, or log.
package sudo

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
)

// SocketPath is where the agent listens inside the sandbox.
const SocketPath = "/run/fence/sudo.sock"

// request is what the client sends first, with its stdin, stdout and
// stderr as SCM_RIGHTS.
type request struct {
	Argv  []string          `json:"argv"`
	User  string            `json:"user,omitempty"` // target; "" = root
	Dir   string            `json:"dir"`
	Env   map[string]string `json:"env,omitempty"`
	Login bool              `json:"login,omitempty"` // -i: the target's login shell
	Shell bool              `json:"shell,omitempty"` // -s: the target's shell
}

// Messages after the request, each 5 bytes: a kind and a big-endian int32.
const (
	msgSignal = 'S' // client → agent: deliver this signal to the command
	msgExit   = 'X' // agent → client: exited with this code
	msgKilled = 'K' // agent → client: killed by this signal
	msgError  = 'E' // agent → client: refused or failed; a text follows
)

const maxRequest = 60 << 10

func writeMsg(w io.Writer, kind byte, v int32) error {
	var b [5]byte
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:], uint32(v))
	_, err := w.Write(b[:])
	return err
}

func readMsg(r io.Reader) (byte, int32, error) {
	var b [5]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, 0, err
	}
	return b[0], int32(binary.BigEndian.Uint32(b[1:])), nil
}

// writeError sends msgError with the text after it.
func writeError(c net.Conn, text string) {
	if len(text) > 4096 {
		text = text[:4096]
	}
	if writeMsg(c, msgError, int32(len(text))) == nil {
		io.WriteString(c, text)
	}
}

func encodeRequest(r *request) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(b) > maxRequest {
		return nil, errors.New("command and environment too large")
	}
	out := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(out, uint32(len(b)))
	copy(out[4:], b)
	return out, nil
}

func decodeRequest(b []byte) (*request, error) {
	if len(b) < 4 {
		return nil, errors.New("short request")
	}
	n := binary.BigEndian.Uint32(b)
	if n > maxRequest || int(n) != len(b)-4 {
		return nil, fmt.Errorf("bad request length %d", n)
	}
	var r request
	if err := json.Unmarshal(b[4:], &r); err != nil {
		return nil, err
	}
	if len(r.Argv) == 0 && !r.Login && !r.Shell {
		return nil, errors.New("no command")
	}
	return &r, nil
}
