package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// emptyDirs must exist as real directories in every template; the backend
// mounts over them. Modes are exact.
var emptyDirs = []struct {
	path string
	mode fs.FileMode
	// clear removes anything the build left inside (device nodes in /dev,
	// stray files in the pseudo-filesystem mount points).
	clear bool
}{
	{"proc", 0o555, true},
	{"sys", 0o555, true},
	{"dev", 0o755, true},
	{"run", 0o755, false},
	{"tmp", 0o777 | fs.ModeSticky, false},
	{".fence", 0o755, true},
}

// finalize makes a built tree fit to be a shared read-only lower layer.
// It never follows a symlink found in the tree.
func finalize(rootfs string) error {
	for _, d := range emptyDirs {
		p := filepath.Join(rootfs, d.path)
		if err := ensureDir(p, d.mode, d.clear); err != nil {
			return err
		}
	}
	// resolv.conf is provided per sandbox by the backend; the template's
	// must be a regular file (a bind-mount target), never a symlink and
	// never the build host's.
	if err := writeRegular(rootfs, "etc/resolv.conf", "# provided by fence at sandbox start\n", 0o644); err != nil {
		return err
	}
	return nil
}

// ensureDir makes p a directory with the given mode, replacing a non-directory
// (symlink included) and, if clear, emptying it.
func ensureDir(p string, mode fs.FileMode, clear bool) error {
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("checking %s: %w", p, err)
	case !fi.IsDir():
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("replacing %s: %w", p, err)
		}
	case clear:
		entries, err := os.ReadDir(p)
		if err != nil {
			return fmt.Errorf("reading %s: %w", p, err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(p, e.Name())); err != nil {
				return fmt.Errorf("clearing %s: %w", p, err)
			}
		}
	}
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating %s: %w", p, err)
	}
	if err := os.Lchown(p, 0, 0); err != nil {
		return fmt.Errorf("chowning %s: %w", p, err)
	}
	if err := os.Chmod(p, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", p, err)
	}
	return nil
}

// writeRegular replaces p (whatever it is) with a regular file holding
// data. p is resolved inside rootfs: a symlink in the tree (an image's
// /etc -> /somewhere) never leads the write out of it.
func writeRegular(rootfs, p, data string, mode fs.FileMode) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(p), err)
	}
	if err := root.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replacing %s: %w", p, err)
	}
	f, err := root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	_, err = f.WriteString(data)
	if err == nil {
		err = f.Chown(0, 0)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}

// Finalize makes a tree built elsewhere (a template build's layer) fit to
// be a shared read-only lower layer, as every template of this package
// is: the mount-point directories exist and are empty, /etc/resolv.conf is
// a regular file. It never follows a symlink found in the tree.
func Finalize(rootfs string) error { return finalize(rootfs) }
