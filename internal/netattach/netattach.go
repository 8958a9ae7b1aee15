// Package netattach is the contract between an isolation backend and the
// network fence of the sandbox it runs (package netfence's Net implements
// it): the backend attaches each network namespace it makes for the
// sandbox to the Network it is handed, and closes the Link it got back.
// Package isolation names these types in its Spec; they stand here, below
// both isolation and netfence, so that neither imports the other.
//
// # Guarantees
//
//   - The package holds types and one error value only: it imports nothing
//     of fence, and nothing but the standard library.
package netattach

import (
	"context"
	"errors"
	"net"
)

// ErrPaused is returned by DialAgent of a paused sandbox, and by a dial
// of a sandbox port while it is paused: nothing inside could answer. A
// Link's DialSandbox while no namespace is attached wraps it.
var ErrPaused = errors.New("sandbox is paused")

// Network is a sandbox's network fence as its owner keeps it (package
// netfence's Net). A backend calls Attach with the sandbox's network
// namespace once the namespace exists and before anything of the sandbox
// runs in it: at create, and again for each namespace it makes later (a
// gVisor resume or restore). kernelPeer says the sandbox's own Linux
// kernel reads and writes the device (the native backend), not a user-space
// stack (gVisor's runsc). The namespace's only way out is then the fence's
// device, and whatever decides on its traffic is the owner's.
type Network interface {
	Attach(ctx context.Context, id, nsPath string, kernelPeer bool) (Link, error)
}

// Link is one attached namespace of a Network.
type Link interface {
	// DialSandbox connects to TCP port inside the sandbox, through the
	// fence (how the daemon reaches the agent of a sandbox that has no
	// other way in, as gVisor's).
	DialSandbox(ctx context.Context, port uint16) (net.Conn, error)
	// Close removes the device and stops its stack. The backend calls it
	// exactly once, once the sandbox can no longer send through the
	// namespace (killed, or its run ended by a pause), or when a create
	// fails after the Attach.
	Close() error
}
