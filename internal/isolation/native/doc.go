// Package native is fence's default isolation backend: Linux namespaces,
// set up from Go with system calls only (no ip, mount or nft processes).
//
// # What a sandbox gets
//
//   - New user, pid, mount, net, uts, ipc, cgroup and time namespaces. The
//     sandbox's uid and gid 0..65535 map to a host range of its own starting
//     at 1<<24 + slot*65536, so sandbox root is never host root and no two
//     sandboxes share a host uid. The cgroup namespace is entered once the
//     sandbox is in its cgroups, so every hierarchy in /proc/self/cgroup
//     reads "/".
//   - A root filesystem: the template directory as an idmapped, read-only
//     overlay lower layer, a per-sandbox upper layer on disk (limited by an
//     ext4 project quota where available, see internal/quota), pivot_root.
//   - /proc with masked paths and read-only /proc/sys, /proc/sysrq-trigger,
//     /proc/irq, /proc/bus, /proc/fs, and a boot ID of each boot's own
//     (a random UUID bound over /proc/sys/kernel/random/boot_id, never
//     the host's); read-only /sys; a minimal /dev (null,
//     zero, full, random, urandom, tty bound from the host, a private devpts
//     instance, shm); no other host device node.
//   - A bounded capability set, no_new_privs, and a seccomp allowlist
//     (internal/seccomp) installed before the agent starts.
//   - cgroup limits on memory (swap included), pids and CPU (internal/cgroup,
//     v1 and v2), RLIMIT_NOFILE within the host's hard limit.
//   - A network namespace of its own, attached to the sandbox's fence
//     (isolation.Spec.Network, its owner's) before the go-ahead: loopback,
//     and the fence's TUN device as the only way out. The sandbox's own
//     kernel is the device's peer (virtio-net headers, see
//     netfence.Fence.Attach); the link is closed once the sandbox's
//     processes are gone.
//
// # How a sandbox starts
//
// The daemon re-executes its own binary as `fence init` in the new
// namespaces. The child blocks on a socketpair until the daemon has placed
// it in its cgroup and sent its configuration together with a detached,
// idmapped mount of the template (open_tree + mount_setattr, made for the
// child's user namespace). The child builds its root, pivots into it,
// drops privileges on every thread and becomes the agent, PID 1 of the
// sandbox, in the same process (package nsinit): the agent's Go runtime is
// the init's, started before the sandbox was asked for (readyinit.go). The
// in-sandbox binary is also bind-mounted read-only at /.fence/fence, for
// fence's sudo and probes. The agent serves on a unix listener the daemon created on a host path that the
// sandbox cannot see; DialAgent connects to it.
//
// # Crash safety
//
// Every host resource of a sandbox is named after its ID and found again
// by Cleanup: the cgroup under fence/<instance>, the socket, the writable
// layer and the state directory. Slots are held with flock, which the
// kernel releases when the holder dies. Mounts live only in the sandbox's
// own mount namespace and vanish with its last process. Cleanup on start
// kills and removes whatever a crashed daemon left; sandboxes are not
// re-attached.
//
// # Layers
//
// Checkpoints, snapshots and forks are frozen copies of a sandbox's
// writable layer (checkpoint.go): made under a temporary name and renamed
// when complete (Cleanup removes temporary ones), immutable once made,
// stacked read-only and idmapped between the template and a new sandbox's
// fresh writable layer, never copied again. Which layers to keep is the
// caller's decision (isolation.Layers); their total size is bounded by
// Options.LayerBudget and a sandbox boots on at most 32 of them.
package native
