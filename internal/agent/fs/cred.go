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
		unix.Setfsgid(int(u.GID))
		unix.Setfsuid(int(u.UID))
		// setfs[ug]id report no error: read the values back.
		if uid, _ := unix.SetfsuidRetUid(-1); uid != int(u.UID) {
			errc <- fmt.Errorf("taking the uid of %s: fsuid is %d", u.Name, uid)
			return
		}
		if gid, _ := unix.SetfsgidRetGid(-1); gid != int(u.GID) {
			errc <- fmt.Errorf("taking the gid of %s: fsgid is %d", u.Name, gid)
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
