package nsinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/seccomp"
)

// Capabilities the sandbox's root keeps (Docker's default set minus
// MKNOD and NET_RAW).
var keptCaps = map[int]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FOWNER: true,
	unix.CAP_FSETID: true, unix.CAP_KILL: true, unix.CAP_SETGID: true,
	unix.CAP_SETUID: true, unix.CAP_SETPCAP: true, unix.CAP_NET_BIND_SERVICE: true,
	unix.CAP_SYS_CHROOT: true, unix.CAP_AUDIT_WRITE: true, unix.CAP_SETFCAP: true,
}

// KeptCaps is the capabilities the sandbox's root keeps, as a bit mask
// (bit n is capability n): every thread's bounding, effective and
// permitted sets once the init is the agent.
func KeptCaps() uint64 {
	var kept uint64
	for c := range keptCaps {
		kept |= 1 << c
	}
	return kept
}

// setupCaps are the capabilities the init uses beyond keptCaps before it
// drops them: mounts, pivot_root, hostname and namespaces (SYS_ADMIN), the
// loopback (NET_ADMIN), a raised descriptor limit (SYS_RESOURCE).
var setupCaps = map[int]bool{unix.CAP_SYS_ADMIN: true, unix.CAP_NET_ADMIN: true, unix.CAP_SYS_RESOURCE: true}

// BoundSpawner drops from the calling process's bounding set, on every
// thread, each capability an init neither keeps nor uses for its setup:
// the native backend's spawner, a host root process that only clones and
// starts inits, can then gain no other through an exec. It does not
// bound the inits: one cloned into a new user namespace starts with a
// full bounding set there, and drops what it does not keep itself
// (boundCapabilities).
func BoundSpawner() error {
	return dropBounding(func(c int) bool { return keptCaps[c] || setupCaps[c] })
}

// The privileges of a process are per thread (its capability sets,
// no_new_privs, seccomp filter and namespaces), and a Go program runs on
// several: every change below is made on all of them at once
// (syscall.AllThreadsSyscall stops the world and makes the call on each
// thread; a thread started later is cloned from one that made it), so no
// thread is left from which the agent could start a command with more.

// allThreads makes a system call on every thread of the process.
func allThreads(trap, a1, a2, a3 uintptr) error {
	if _, _, errno := syscall.AllThreadsSyscall(trap, a1, a2, a3); errno != 0 {
		return errno
	}
	return nil
}

// boundCapabilities drops every capability the sandbox does not keep from
// the bounding set and clears the ambient set. The effective and permitted
// sets are left as they are: the setup still needs them. Every thread of
// the init was started by the runtime from the first and holds the same
// sets, which are read on this one: only what is there is dropped (each
// drop stops every thread). A new user namespace starts with a full
// bounding set and an empty ambient set, so the ambient set needs no
// clearing unless something raised it.
//
// The in-sandbox binary built by scripts/build.sh on linux/amd64 makes
// the drops at its entry point, while it has one thread
// (cmd/fence-sandbox/entry_linux_amd64.s), and this finds none left to
// make: about 8 ms of CPU less per init, whose thirty-odd all-thread
// calls each stopped and signalled every thread of the runtime.
func boundCapabilities() error {
	if err := dropBounding(func(c int) bool { return keptCaps[c] }); err != nil {
		return err
	}
	ambient := false
	for c := 0; c <= 63 && !ambient; c++ {
		set, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0)
		if err != nil {
			break // past the kernel's last capability
		}
		ambient = set == 1
	}
	if ambient {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil {
			return fmt.Errorf("clearing ambient capabilities: %w", err)
		}
	}
	return nil
}

// dropBounding drops, on every thread, each capability of the bounding
// set (as this thread holds it) that keep does not name.
func dropBounding(keep func(int) bool) error {
	for c := 0; c <= 63; c++ {
		in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			return fmt.Errorf("reading capability %d: %w", c, err)
		}
		if in == 0 || keep(c) {
			continue
		}
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil {
			return fmt.Errorf("dropping capability %d: %w", c, err)
		}
	}
	return nil
}

// enterCgroupNamespace makes a cgroup namespace on this thread and moves
// every other thread into it.
func enterCgroupNamespace() error {
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("entering cgroup namespace: %w", err)
	}
	ns, err := unix.Open("/proc/thread-self/ns/cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("entering cgroup namespace: %w", err)
	}
	defer unix.Close(ns)
	if err := allThreads(unix.SYS_SETNS, uintptr(ns), unix.CLONE_NEWCGROUP, 0); err != nil {
		return fmt.Errorf("entering cgroup namespace: %w", err)
	}
	return nil
}

// dropPrivileges leaves every thread with the kept capabilities only
// (effective, permitted; inheritable within them), no_new_privs and the
// seccomp filter: what the agent would have had from an exec as the
// sandbox's root, after boundCapabilities. With noSetFCap, CAP_SETFCAP
// leaves the bounding set too, so no process of the sandbox has it.
func dropPrivileges(filter []byte, noSetFCap bool) error {
	kept := KeptCaps()
	if noSetFCap {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SETFCAP, 0); err != nil {
			return fmt.Errorf("dropping CAP_SETFCAP: %w", err)
		}
		kept &^= 1 << unix.CAP_SETFCAP
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	for i := range data {
		k := uint32(kept >> (32 * i))
		data[i].Effective, data[i].Permitted, data[i].Inheritable = k, k, data[i].Inheritable&k
	}
	hdr.Pid = 0
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("dropping capabilities: %w", err)
	}
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(&data)
	if len(filter) == 0 {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
			return fmt.Errorf("setting no_new_privs: %w", err)
		}
		return nil
	}
	prog, err := DecodeFilter(filter)
	if err != nil {
		return err
	}
	// no_new_privs on this (locked) thread; the filter's TSYNC gives it
	// to every other thread with the filter, in one call that does not
	// stop them, or fails with nothing installed.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	if err := seccomp.InstallAllThreads(prog); err != nil {
		return fmt.Errorf("installing seccomp filter: %w", err)
	}
	return nil
}

// EncodeFilter and DecodeFilter carry a BPF program from the daemon to
// `fence init`: 8 bytes per instruction, little endian.
func EncodeFilter(prog []unix.SockFilter) []byte {
	out := make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		out = binary.LittleEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.LittleEndian.AppendUint32(out, in.K)
	}
	return out
}

func DecodeFilter(b []byte) ([]unix.SockFilter, error) {
	if len(b) == 0 || len(b)%8 != 0 {
		return nil, fmt.Errorf("seccomp filter of %d bytes: want a multiple of 8", len(b))
	}
	prog := make([]unix.SockFilter, len(b)/8)
	for i := range prog {
		c := b[8*i:]
		prog[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(c), Jt: c[2], Jf: c[3], K: binary.LittleEndian.Uint32(c[4:])}
	}
	return prog, nil
}
