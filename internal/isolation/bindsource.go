package isolation

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// ErrBindRefused marks a bind source that would hand the host, or fence
// itself, to a sandbox.
var ErrBindRefused = errors.New("bind refused")

// DefaultDataDir is where fence keeps its state and keys unless told
// otherwise. It is never bound into a sandbox, whatever data dir a caller
// names.
const DefaultDataDir = "/var/lib/fence"

// hostPlace is a host path whose bind into a sandbox would hand the host
// over: the sandbox's user becomes the owner of every file of the bound
// directory's owner (root's, for the places below) inside it.
type hostPlace struct {
	path string
	why  string
	// readOnly means a read-only bind is allowed (root's files then stay
	// root's: nobody inside); otherwise the place is never bound.
	readOnly bool
	// exact means only the path itself (and what contains it) is
	// refused, not what lies inside: /root/proj is a project, /root is
	// root's account.
	exact bool
}

// hostPlaces are refused whatever their owner, together with anything
// that contains them and, unless exact, anything inside them.
var hostPlaces = []hostPlace{
	{path: "/proc", why: "the host's processes and kernel settings"},
	{path: "/sys", why: "the host's kernel and devices"},
	{path: "/dev", why: "the host's devices"},
	{path: "/run", why: "the host's runtime state and daemon sockets"},
	{path: "/var/run", why: "the host's runtime state and daemon sockets"},
	{path: "/etc", why: "the host's configuration", readOnly: true},
	{path: "/usr", why: "the host's programs and libraries", readOnly: true},
	{path: "/bin", why: "the host's programs", readOnly: true},
	{path: "/sbin", why: "the host's programs", readOnly: true},
	{path: "/lib", why: "the host's libraries", readOnly: true},
	{path: "/lib32", why: "the host's libraries", readOnly: true},
	{path: "/lib64", why: "the host's libraries", readOnly: true},
	{path: "/libx32", why: "the host's libraries", readOnly: true},
	{path: "/boot", why: "the host's kernel and boot loader", readOnly: true},
	{path: "/snap", why: "the host's installed programs", readOnly: true},
	{path: "/nix", why: "the host's installed programs", readOnly: true},
	{path: "/var/lib", why: "the host's system state (package database, services)", readOnly: true},
	{path: "/var/spool", why: "the host's cron and mail spools", readOnly: true},
	{path: "/var/cache", why: "the host's system caches", readOnly: true},
	{path: "/var/log", why: "the host's logs", readOnly: true},
	{path: "/var/backups", why: "the host's backups", readOnly: true},
	{path: "/var/mail", why: "the host's mailboxes", readOnly: true},
	{path: "/root", why: "root's home directory (its shell startup files and ssh keys)", readOnly: true, exact: true},
	{path: "/home", why: "the directory of every user's home", readOnly: true, exact: true},
	{path: "/var", why: "the host's variable data", readOnly: true, exact: true},
	{path: "/tmp", why: "the temporary directory every user and service shares", readOnly: true, exact: true},
	{path: "/var/tmp", why: "the temporary directory every user and service shares", readOnly: true, exact: true},
	{path: "/opt", why: "the host's installed programs", readOnly: true, exact: true},
	{path: "/srv", why: "the host's served data", readOnly: true, exact: true},
	{path: "/mnt", why: "the host's mount points", readOnly: true, exact: true},
	{path: "/media", why: "the host's mount points", readOnly: true, exact: true},
}

// CheckBindSource returns an error wrapping ErrBindRefused when the host
// path host (absolute, clean, its symlinks already resolved) may not be
// bound into a sandbox, writable or, with readOnly, read-only. It is the
// one check of every bind fence makes: `fence run -v` applies it to give
// a clear error early, and the native backend applies it again to the
// path of the directory it actually opened.
//
// Refused, read-only or not: the host's root; /proc, /sys, /dev, /run;
// fence's data dir (DefaultDataDir and each of fenceDirs, such as the
// data dir and templates dir in use: they hold the daemon's keys, the
// sandboxes' state and the templates every sandbox runs); and any path
// that lies inside one of them or contains one.
//
// Refused writable (a writable bind makes the directory's owner, root for
// these, the sandbox's user): the host's system trees (/etc, /usr, /bin,
// /sbin, /lib*, /boot, /var/lib, /var/spool, /var/log, ...), the shared
// roots /root, /home, /var, /tmp, /var/tmp, /opt, /srv, /mnt and /media
// themselves (not what lies below them: /root/proj is a project), each
// home directory under /home itself, and the hidden entries of a home
// (/root/.ssh, /home/NAME/.bashrc: shell startup files, ssh keys and
// credentials are the account).
func CheckBindSource(host string, readOnly bool, fenceDirs ...string) error {
	if !filepath.IsAbs(host) || filepath.Clean(host) != host {
		return fmt.Errorf("%w: %s: want a clean absolute path", ErrBindRefused, host)
	}
	if host == "/" {
		return fmt.Errorf("%w: / is the host's root", ErrBindRefused)
	}
	for _, d := range append([]string{DefaultDataDir}, fenceDirs...) {
		if d == "" {
			continue
		}
		d = resolvedDir(d)
		switch {
		case host == d:
			return fmt.Errorf("%w: %s is fence's directory (its keys, sandbox state and templates)", ErrBindRefused, host)
		case within(host, d):
			return fmt.Errorf("%w: %s is inside fence's directory %s (its keys, sandbox state and templates)", ErrBindRefused, host, d)
		case within(d, host):
			return fmt.Errorf("%w: %s contains fence's directory %s (its keys, sandbox state and templates)", ErrBindRefused, host, d)
		}
	}
	for _, pl := range hostPlaces {
		if readOnly && pl.readOnly {
			continue
		}
		var what string
		switch {
		case host == pl.path:
			what = "is"
		case within(pl.path, host):
			what = "contains " + pl.path + ","
		case !pl.exact && within(host, pl.path):
			what = "is inside " + pl.path + ","
		default:
			continue
		}
		if pl.readOnly {
			return fmt.Errorf("%w: %s %s %s: bind it read-only (:ro) if the sandbox must see it", ErrBindRefused, host, what, pl.why)
		}
		return fmt.Errorf("%w: %s %s %s", ErrBindRefused, host, what, pl.why)
	}
	if !readOnly {
		if home, rest, ok := homeOf(host); ok {
			if rest == "" {
				return fmt.Errorf("%w: %s is a home directory (its shell startup files, ssh keys and credentials): bind a project directory below it, or the home read-only (:ro)", ErrBindRefused, host)
			}
			if strings.HasPrefix(rest, ".") {
				return fmt.Errorf("%w: %s is a hidden entry of the home %s (shell startup files, ssh keys, credentials): bind it read-only (:ro) if the sandbox must see it", ErrBindRefused, host, home)
			}
		}
	}
	return nil
}

// homeOf splits p into the home directory it lies in (/root or
// /home/NAME) and the first name below that home ("" for the home
// itself).
func homeOf(p string) (home, first string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/root/")
	if ok {
		home = "/root"
	} else if rest, ok = strings.CutPrefix(p, "/home/"); ok {
		name, below, _ := strings.Cut(rest, "/")
		home, rest = "/home/"+name, below
	} else {
		return "", "", false
	}
	first, _, _ = strings.Cut(rest, "/")
	return home, first, true
}

// within reports whether p is dir or lies under it. Both are clean and
// absolute.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// resolvedDir returns dir absolute and with its symlinks resolved, or as
// far as it exists (a data dir not made yet must not be bound either).
func resolvedDir(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return filepath.Clean(dir)
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r
	}
	return abs
}
