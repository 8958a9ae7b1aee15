package fs

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/users"
)

// asUser runs fn with u's filesystem credentials, so that the kernel checks
// permissions and resolves symlinks as u would: a symlink planted by u
// cannot make the agent (root) read or write what u could not. What fn
// creates is owned by u.
//
// fn runs on an OS thread of its own whose fsuid, fsgid and supplementary
// groups are u's (Linux keeps them per thread; the raw system calls change
// only this one). The thread is never handed back to the Go runtime: it
// ends with the goroutine, so no other code ever runs with u's
// credentials. When u is the agent's own user, fn runs directly.
func asUser(u *users.User, fn func() error) error {
	if int(u.UID) == os.Geteuid() && int(u.GID) == os.Getegid() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with us
		groups := make([]int, len(u.Groups))
		for i, g := range u.Groups {
			groups[i] = int(g)
		}
		if len(groups) == 0 {
			groups = []int{int(u.GID)}
		}
		if err := unix.Setgroups(groups); err != nil {
			errc <- fmt.Errorf("taking the groups of %s: %w", u.Name, err)
			return
		}
		if err := takeIDs(u); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// runAs is asUser for a function with a result.
func runAs[T any](u *users.User, fn func() (T, error)) (T, error) {
	var res T
	err := asUser(u, func() (err error) {
		res, err = fn()
		return err
	})
	return res, err
}

// takeIDs gives the calling thread u's filesystem uid and gid: with
// setfs[ug]id, or, where the kernel lacks them (gVisor answers ENOSYS),
// by making u's IDs the thread's effective ones (setresuid/setresgid
// with the real and saved IDs kept), which the filesystem IDs follow.
// Both are raw system calls that change this thread alone (not Go's
// all-threads syscall.Setresuid). The values are read back either way.
func takeIDs(u *users.User) error {
	unix.Setfsgid(int(u.GID))
	unix.Setfsuid(int(u.UID))
	// setfs[ug]id report no error: read the values back.
	uid, _ := unix.SetfsuidRetUid(-1)
	gid, _ := unix.SetfsgidRetGid(-1)
	if uid == int(u.UID) && gid == int(u.GID) {
		return nil
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); e != unix.ENOSYS {
		return fmt.Errorf("taking the uid of %s: fsuid is %d, fsgid %d", u.Name, uid, gid)
	}
	none := ^uintptr(0) // -1: leave unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, none, uintptr(u.GID), none); e != 0 {
		return fmt.Errorf("taking the gid of %s: %w", u.Name, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, none, uintptr(u.UID), none); e != 0 {
		return fmt.Errorf("taking the uid of %s: %w", u.Name, e)
	}
	if _, e, _ := unix.Getresuid(); e != int(u.UID) {
		return fmt.Errorf("taking the uid of %s: euid is %d", u.Name, e)
	}
	if _, e, _ := unix.Getresgid(); e != int(u.GID) {
		return fmt.Errorf("taking the gid of %s: egid is %d", u.Name, e)
	}
	return nil
}

// asAgent runs fn with the agent's own credentials, from inside asUser:
// on a goroutine of its own, which never runs on a thread asUser has
// changed (such a thread is locked to its goroutine for good). fn must
// name what it touches through descriptors the caller opened as the user.
func asAgent(fn func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- fn() }()
	return <-errc
}
