// Package keyfile reads and writes the daemon's private key files (the
// gateway CA key, the audit signing key, the secrets encryption key) and
// the small state files next to them.
//
// # Guarantees
//
//   - ReadPrivate never follows a symlink (the final component is opened
//     with O_NOFOLLOW) and returns the bytes only of a regular file owned by
//     the daemon's effective uid that its group and others cannot access at
//     all: a key someone else can read or replace protects nothing.
//   - CreatePrivate writes the whole file under a temporary name (mode 0600
//     whatever the umask), syncs it and links it into place: the key is
//     never seen partly written, and a file that appeared meanwhile is never
//     replaced (the error wraps fs.ErrExist).
//   - WriteAtomic replaces a file by rename after syncing it, then syncs
//     the directory: a crash leaves the old content or the new, never a mix.
//   - Every descriptor is opened close-on-exec.
package keyfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrSymlink is wrapped by ReadPrivate's error for a key that is a symlink.
var ErrSymlink = errors.New("is a symlink: refused")

// ReadPrivate reads at most max bytes of the private file at path. A
// missing file is an error wrapping fs.ErrNotExist; a symlink, a file that
// is not regular, owned by another uid, or with any group/other permission
// bit set is refused with an error that says which and how to fix it.
func ReadPrivate(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s %w", path, ErrSymlink)
	}
	if err != nil {
		return nil, err // *PathError: names the path, wraps ErrNotExist
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s is not a regular file: refused", path)
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("%s is owned by uid %d, not by the daemon's uid %d: refused", path, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return nil, fmt.Errorf("%s has mode %04o: group and others must have no access (chmod 600 it, and rotate the key if it leaked)", path, st.Mode&0o7777)
	case st.Size > max:
		return nil, fmt.Errorf("%s holds %d bytes, more than a key file's %d", path, st.Size, max)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// ReadNoFollow reads at most max bytes of the regular file at path
// without following a symlink; for public files (certificates, public
// keys) that need no permission check.
func ReadNoFollow(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s %w", path, ErrSymlink)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file: refused", path)
	}
	return io.ReadAll(io.LimitReader(f, max))
}

// CreatePrivate creates path holding data with mode 0600. If path exists
// (before or meanwhile) it is left alone and the error wraps fs.ErrExist.
func CreatePrivate(path string, data []byte) error {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	defer os.Remove(tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600) // whatever the umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// Link, not rename: a file that appeared meanwhile is never replaced.
	if err := os.Link(tmp, path); err != nil {
		return fmt.Errorf("installing %s: %w", path, err)
	}
	SyncDir(filepath.Dir(path))
	return nil
}

// WriteAtomic replaces path with data (mode perm) through a synced
// temporary file renamed into place, then syncs the directory.
func WriteAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	done = true
	SyncDir(dir)
	return nil
}

// SyncDir fsyncs a directory so a rename or link in it is durable. Errors
// are ignored: not every filesystem supports syncing a directory.
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
