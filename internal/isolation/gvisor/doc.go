// Package gvisor is fence's gVisor isolation backend: each sandbox is a
// runsc sandbox (gVisor's user-space kernel on the systrap platform), so
// the sandbox's system calls are served by gVisor, not the host kernel.
//
// # What a sandbox gets
//
//   - The fence agent as PID 1 (package boot's contract), listening on
//     boot.Port at the sandbox's own address; the daemon reaches it
//     through the sandbox's network stack, never through a host socket,
//     and the agent serves only connections from the stack's end of the
//     network (egress.GatewayIPv4), an address no process of the sandbox
//     can send from: gVisor binds a socket only to a local address (it
//     ignores IP_FREEBIND and IP_TRANSPARENT), runsc gives no raw sockets,
//     and adding an address takes CAP_NET_ADMIN, which the sandbox lacks.
//     So, as on native, no process inside can drive the agent.
//   - The template as a read-only root under a gVisor overlay whose upper
//     layer lives in a host file of the sandbox's own (runsc
//     --overlay2=root:dir=…), bounded by the disk limit.
//   - The same network fence as every backend (internal/netfence), its
//     owner's (Spec.Network): the backend makes a network namespace per
//     run and attaches it to the fence, which puts a TUN device in it;
//     runsc (--network=sandbox) adopts the device into gVisor's stack, and
//     every packet the sandbox sends comes out of the TUN into the
//     owner's stack.
//   - The same limits as native: a cgroup (internal/cgroup) made by the
//     backend with the memory, pids and CPU limits, which runsc joins with
//     the sentry and gofer; RLIMIT_NOFILE in the OCI spec.
//   - /etc/hosts, /etc/resolv.conf and the gateway's CA bound read-only
//     from the sandbox's host directory; sudo is the agent's
//     (/usr/bin/sudo is the fence binary).
//
// # Pause keeps memory and processes
//
// Pause checkpoints the sandbox with `runsc checkpoint` (memory, processes,
// open files and the overlay's contents) into an image in the sandbox's
// directory, after which no process of it exists on the host. Resume
// restores the image with `runsc restore` into a fresh network namespace,
// attached to the sandbox's fence anew (its owner's stack then has the
// sandbox's current policy). The image on disk
// is the state: a restarted daemon adopts a paused sandbox (Adopt) and
// resumes it like any other. An image never changes once written, so one
// image can be restored more than once (a fork with memory) under new IDs.
// A pause first waits, at most half a second, for the sandbox to go idle,
// so that a command started just before it is past its start (slow on
// gVisor) and its timers, which gVisor's clocks run on through the
// checkpoint, count the pause as they do on native.
//
// # Layers keep memory
//
// The backend implements isolation.Layers with checkpoint images (see
// layers.go): Checkpoint is `runsc checkpoint --leave-running` into a new
// layer (LayerInfo.Memory), and CreateOn restores it under a new ID with
// a fresh directory, cgroup, network namespace and stack, so snapshots,
// forks and rewinds carry running processes. CheckpointFiles (`runsc
// fscheckpoint`) makes a files-only layer, on which CreateOn boots a fresh
// run (the pause without memory). Listing changed files is not supported
// (isolation.ErrUnsupported): the writable layer is gVisor's overlay file.
//
// # Crash safety
//
// Every host resource is named after the sandbox ID: the runsc container
// (in the instance's runsc root), the cgroup under fence/<instance>, and
// the sandbox directory (bundle, bound files, overlay file, image).
// Network namespaces and TUN devices live only as descriptors of the
// daemon and vanish with it. Cleanup deletes every container, cgroup and
// directory of the instance that is neither live nor adopted, then the
// layers a crash left half-made (.tmp- directories: a layer is complete
// only once renamed into place).
//
// # What differs from native
//
// The agent has no lifeline: a running sandbox outlives a crashed daemon
// (its network is dead, since the daemon held its stack) until the next
// start's Cleanup removes it. Bound /etc files are read-only.
package gvisor
