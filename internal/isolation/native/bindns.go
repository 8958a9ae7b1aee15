package native

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HoldArg is the argument with which the fence binary only waits for EOF
// on stdin: the process whose user namespace a bind's idmap is taken from.
const HoldArg = "__fence-hold-userns"

// Hold is the HoldArg role.
func Hold() {
	io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// sandboxUserID is the uid (and gid) of the templates' unprivileged user,
// as whom a sandbox writes into its binds.
const sandboxUserID = 1000

// bindUserNS returns a user namespace descriptor whose only mapping makes
// host id ownerUID/ownerGID the sandbox's user (hostUser = its kuid).
//
// Bound through it, a host directory's files of its owner appear as the
// sandbox's user and what the sandbox writes there lands owned by that
// owner; every other host id (root's above all) is unmapped, so the
// sandbox can neither create root-owned files on the host nor take over
// files of anyone else. (The seccomp filter refuses setuid and setgid
// modes, so no set-id file of the owner can be planted either; where the
// owner is root, the sandbox also lacks CAP_SETFCAP and the tree holds no
// set-id or capability-bearing file, see bindTree.)
func bindUserNS(exe string, ownerUID, ownerGID, hostUser uint32) (int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer w.Close()
	defer r.Close()
	cmd := &exec.Cmd{
		Path:  exe,
		Args:  []string{"fence", HoldArg},
		Stdin: r,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: int(ownerUID), HostID: int(hostUser), Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: int(ownerGID), HostID: int(hostUser), Size: 1}},
		},
		WaitDelay: time.Second,
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("starting a user namespace for a bind: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	w.Close()
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("opening a bind's user namespace: %w", err)
	}
	return fd, nil
}
