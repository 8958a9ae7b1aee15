// Package users resolves the Unix users that the agent's requests act as
// and expands request paths the way envd does.
//
// A request names its user with HTTP Basic auth (the username part, the
// password is empty) or, for the /files routes, the username query
// parameter. No name selects the default user. Users are looked up in the
// sandbox's own /etc/passwd and /etc/group through os/user (pure Go when
// built with CGO_ENABLED=0). A lookup is kept while both files keep the
// same inode, size and modification and change times (and their change
// time is a second old), so accounts added or changed inside the sandbox
// are seen by the next request.
//
// The package makes no security decision on the daemon's behalf: the daemon
// authenticates requests; the username only chooses whose identity the
// sandbox's kernel applies.
package users

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// ErrUnknownUser is returned (wrapped) for a username with no account.
var ErrUnknownUser = errors.New("invalid username")

// User is a resolved Unix account.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, the primary group included
	Home   string
	Shell  string // login shell from /etc/passwd; "" if unknown
}

// Lookup resolves the account called name.
func Lookup(name string) (*User, error) {
	return defaultCache.lookup(name, lookup)
}

// lookup resolves name from /etc/passwd and /etc/group, every time: the
// account from one read of /etc/passwd (its login shell too, which os/user
// does not give), its groups through os/user.
func lookup(name string) (*User, error) {
	if name == "" {
		return nil, fmt.Errorf("looking up user %q: %w", name, ErrUnknownUser)
	}
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return nil, fmt.Errorf("looking up user %q: %w", name, ErrUnknownUser)
	}
	f, ok := passwdEntry(b, name)
	if !ok {
		return nil, fmt.Errorf("looking up user %q: %w", name, ErrUnknownUser)
	}
	uid, err := strconv.ParseUint(f[2], 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing uid of %q: %w", name, err)
	}
	gid, err := strconv.ParseUint(f[3], 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parsing gid of %q: %w", name, err)
	}
	res := &User{Name: f[0], UID: uint32(uid), GID: uint32(gid), Home: f[5], Shell: f[6]}
	if res.Home == "" {
		res.Home = "/"
	}
	u := &user.User{Username: f[0], Uid: f[2], Gid: f[3], HomeDir: f[5]}
	ids, err := u.GroupIds()
	if err == nil {
		for _, s := range ids {
			if g, err := strconv.ParseUint(s, 10, 32); err == nil {
				res.Groups = append(res.Groups, uint32(g))
			}
		}
	}
	if len(res.Groups) == 0 {
		res.Groups = []uint32{res.GID}
	}
	return res, nil
}

// passwdEntry returns the seven fields of name's line in the /etc/passwd
// content b, found as os/user finds it: the first line, spaces around it
// trimmed, not blank nor a comment, of six colons or more, whose first
// field is name (not a NIS "+" or "-" entry) and whose uid and gid are
// numbers.
func passwdEntry(b []byte, name string) ([]string, bool) {
	for line := range strings.SplitSeq(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, name+":") || strings.Count(line, ":") < 6 {
			continue
		}
		f := strings.SplitN(line, ":", 7)
		if f[0][0] == '+' || f[0][0] == '-' {
			continue
		}
		if _, err := strconv.Atoi(f[2]); err != nil {
			continue
		}
		if _, err := strconv.Atoi(f[3]); err != nil {
			continue
		}
		return f, true
	}
	return nil, false
}

// LookupID resolves the account with uid.
func LookupID(uid uint32) (*User, error) {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return nil, fmt.Errorf("looking up uid %d: %w", uid, ErrUnknownUser)
	}
	return Lookup(u.Username)
}

// LookupGroup returns the gid of the group called name.
func LookupGroup(name string) (uint32, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, err
	}
	gid, err := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(gid), err
}

// Resolver picks the user of a request.
type Resolver struct {
	// DefaultUser is used when a request names no user. Empty means "user"
	// if that account exists, else "root". Set it before first use, or
	// later with Set.
	DefaultUser string
	// DefaultWorkdir is where an empty path or cwd points. Empty means the
	// user's home.
	DefaultWorkdir string

	mu sync.RWMutex // guards the two fields above after first use
}

// Set replaces the default user and workdir (the agent's /init).
func (r *Resolver) Set(defaultUser, defaultWorkdir string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.DefaultUser, r.DefaultWorkdir = defaultUser, defaultWorkdir
}

func (r *Resolver) defaults() (user, workdir string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.DefaultUser, r.DefaultWorkdir
}

// Default returns the default user.
func (r *Resolver) Default() (*User, error) {
	if name, _ := r.defaults(); name != "" {
		return Lookup(name)
	}
	if u, err := Lookup("user"); err == nil {
		return u, nil
	}
	return Lookup("root")
}

// Warm resolves the default user now, so that the first request naming no
// user finds it resolved. It must run in the sandbox's root: the lookups
// read /etc/passwd and /etc/group, and the standard library keeps the
// process's own account from the first.
func (r *Resolver) Warm() { _, _ = r.Default() }

// ByName returns the named user, or the default user for "".
func (r *Resolver) ByName(name string) (*User, error) {
	if name == "" {
		return r.Default()
	}
	return Lookup(name)
}

// FromHeader returns the user named by the Basic-auth username in h, or
// the default user when h has no Authorization header.
func (r *Resolver) FromHeader(h http.Header) (*User, error) {
	auth := h.Get("Authorization")
	if auth == "" {
		return r.Default()
	}
	name, ok := basicUsername(auth)
	if !ok {
		return nil, fmt.Errorf("parsing authorization header: %w", ErrUnknownUser)
	}
	return r.ByName(name)
}

func basicUsername(auth string) (string, bool) {
	const prefix = "basic "
	if len(auth) < len(prefix) || !strings.EqualFold(auth[:len(prefix)], prefix) {
		return "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(auth[len(prefix):]))
	if err != nil {
		return "", false
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, true
}

// Workdir returns the directory an empty path refers to for u.
func (r *Resolver) Workdir(u *User) string {
	if _, wd := r.defaults(); wd != "" {
		return filepath.Clean(wd)
	}
	return u.Home
}

// ResolvePath turns a request path into an absolute, cleaned path: "" is
// the default workdir, a leading "~" is u's home, and a relative path is
// taken against u's home.
func (r *Resolver) ResolvePath(p string, u *User) string {
	switch {
	case p == "":
		return r.Workdir(u)
	case p == "~":
		return filepath.Clean(u.Home)
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(u.Home, p[2:])
	case filepath.IsAbs(p):
		return filepath.Clean(p)
	default:
		return filepath.Join(u.Home, p)
	}
}
