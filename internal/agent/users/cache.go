package users

import (
	"errors"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Every request resolves its user, and a lookup through os/user reads and
// parses /etc/passwd twice and /etc/group once: on an exec of `true` that
// was the largest part of the agent's own work. Lookup keeps what it found
// while neither file has changed since, which a stat of each tells. An
// account file is trusted not to have changed only when its change time
// (which no one can set back) lies settleTime or more before the stat that
// found it: a later write then gives it another change time, even with the
// kernel's coarse timestamp clock, or another inode when it is replaced.

// settleTime is how old both account files' change times must be for a
// lookup to be kept.
const settleTime = time.Second

// maxCached bounds the names the cache holds (unknown names included).
const maxCached = 64

// accountFiles are the files os/user reads, in the order stamps are taken.
var accountFiles = [2]string{"/etc/passwd", "/etc/group"}

// stamp identifies one version of a file.
type stamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

// lookupCache holds lookups for one version of the account files.
type lookupCache struct {
	files [2]string
	now   func() time.Time

	mu     sync.Mutex
	stamps [2]stamp
	byName map[string]cachedLookup
}

type cachedLookup struct {
	u   *User
	err error
}

var defaultCache = &lookupCache{files: accountFiles, now: time.Now}

// stat stamps both files; settled reports whether both changed at least
// settleTime before now. ok is false when either cannot be stat'ed.
func (c *lookupCache) stat() (st [2]stamp, settled, ok bool) {
	now := c.now()
	settled = true
	for i, f := range c.files {
		var s unix.Stat_t
		if err := unix.Stat(f, &s); err != nil {
			return st, false, false
		}
		st[i] = stamp{dev: s.Dev, ino: s.Ino, size: s.Size, mtime: s.Mtim, ctime: s.Ctim}
		if now.Sub(time.Unix(s.Ctim.Unix())) < settleTime {
			settled = false
		}
	}
	return st, settled, true
}

// lookup returns load(name), from the cache when the files have not
// changed since it was loaded. Only successes and unknown names are kept.
func (c *lookupCache) lookup(name string, load func(string) (*User, error)) (*User, error) {
	st, settled, ok := c.stat()
	if !ok {
		return load(name)
	}
	c.mu.Lock()
	if st != c.stamps || c.byName == nil {
		c.stamps, c.byName = st, make(map[string]cachedLookup)
	}
	e, hit := c.byName[name]
	c.mu.Unlock()
	if hit {
		return e.u.clone(), e.err
	}
	u, err := load(name)
	if !settled || (err != nil && !errors.Is(err, ErrUnknownUser)) {
		return u, err
	}
	c.mu.Lock()
	// Files that changed meanwhile have other stamps: what load read may
	// be newer than st, so it is kept only under st, which the next
	// lookup will not match.
	if c.stamps == st && len(c.byName) < maxCached {
		c.byName[name] = cachedLookup{u: u.clone(), err: err}
	}
	c.mu.Unlock()
	return u, err
}

// clone copies u (nil stays nil), so that callers never share a User.
func (u *User) clone() *User {
	if u == nil {
		return nil
	}
	c := *u
	c.Groups = slices.Clone(u.Groups)
	return &c
}
