// Package boot is the contract between an isolation backend that starts a
// sandbox and the fence agent that runs as the sandbox's PID 1: where the
// fence binary is inside the sandbox, how the agent is started, and how it
// finds its configuration, its listener and its lifeline. Every backend
// (internal/isolation/native, internal/isolation/gvisor) starts the agent
// through it, and the agent role (`fence agent`) reads it; nothing else
// about the agent's start is shared between them.
//
// # The contract
//
//   - The fence binary is at Path inside the sandbox, read-only. A backend
//     executes it as Argv with the environment Env returns (a fixed PATH and
//     the Config as JSON in ConfigEnv; the agent removes ConfigEnv from its
//     own environment before it starts anything), or, as the native
//     backend's init does, becomes the agent in the process that set the
//     sandbox up, with the Config in hand and that same environment.
//   - The agent serves envd's protocol on the listener it inherits as
//     ListenerFD, or, when ListenEnv is set, on a TCP listener it opens at
//     that address itself (a backend that cannot hand a host socket in,
//     such as gVisor, whose sandbox must survive a checkpoint and restore).
//     A TCP listener serves only connections from PeerEnv's address, the
//     supervisor's own side of the sandbox's network, and drops every
//     other one unread: no process inside the sandbox can drive the agent
//     (start commands as root past the template's sudo rules) any more
//     than it can reach an inherited listener whose socket is on a host
//     path. The agent refuses to start with ListenEnv but no PeerEnv.
//   - If LifelineFD is open, EOF on it means the supervisor has died and
//     the agent ends the sandbox. A backend whose sandboxes must outlive
//     their supervisor (a checkpointed gVisor sandbox is restored by the
//     next daemon) gives none, and removes leftovers itself on the next
//     start.
//   - Config holds nothing secret: the sandbox can read all of it.
package boot

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
)

// Path is where the fence binary is inside every sandbox (read-only).
const Path = "/.fence/fence"

// Argv is the agent's argument vector.
var Argv = []string{"fence", "agent"}

// DefaultPath is the PATH the agent starts with.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Descriptors the agent may inherit.
const (
	// ListenerFD is the agent's listening socket when ListenEnv is unset.
	ListenerFD = 4
	// LifelineFD is the read end of a pipe, or a socket whose peer the
	// supervisor holds (the native backend's, which also carries the
	// agent's stderr the other way), whose EOF tells the agent that the
	// process supervising the sandbox has died.
	LifelineFD = 5
)

// ConfigEnv carries the agent's Config (JSON) into `fence agent`.
const ConfigEnv = "FENCE_AGENT_CONFIG"

// ListenEnv, when set, is the TCP address ("host:port") the agent listens
// on instead of inheriting ListenerFD.
const ListenEnv = "FENCE_AGENT_LISTEN"

// PeerEnv is the one remote address (an IP address, no port) the agent
// serves connections from when ListenEnv is set. It must be an address no
// process inside the sandbox can send from: the supervisor's end of the
// sandbox's network, not one of the sandbox's own addresses or loopback.
const PeerEnv = "FENCE_AGENT_PEER"

// Port is the agent's TCP port when it listens on the sandbox's network:
// envd's port, which E2B clients address it by.
const Port = 49983

// Config is what the agent inside the sandbox needs to know. It holds no
// secret: anything in it is visible to the sandbox.
type Config struct {
	EnvVars        map[string]string `json:"envVars,omitempty"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
}

// TCP is where an agent that opens its own listener listens, and the one
// address it serves.
type TCP struct {
	Listen netip.AddrPort // ListenEnv
	Peer   netip.Addr     // PeerEnv
}

// Env returns the agent's environment for cfg; tcp, if not nil, makes the
// agent listen on TCP (ListenEnv and PeerEnv).
func Env(cfg Config, tcp *TCP) ([]string, error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encoding agent config: %w", err)
	}
	env := []string{DefaultPath, ConfigEnv + "=" + string(raw)}
	if tcp != nil {
		if !tcp.Listen.IsValid() || !tcp.Peer.IsValid() {
			return nil, errors.New("agent TCP listener: an address and a peer are both required")
		}
		env = append(env, ListenEnv+"="+tcp.Listen.String(), PeerEnv+"="+tcp.Peer.String())
	}
	return env, nil
}
