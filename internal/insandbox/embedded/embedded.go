// Package embedded carries the in-sandbox binary (cmd/fence-sandbox)
// inside the fence binary, and writes it out where the backends can run
// it. scripts/build.sh builds the in-sandbox binary into this directory
// and then the fence binary with the build tag fence_sandbox_bin, which
// embeds it; without the tag the fence binary carries none and runs
// itself in its sandboxes.
//
// # Guarantees
//
//   - Extract writes the binary at most once per content: its name holds
//     the SHA-256 of its bytes, it is written to a temporary name, synced
//     and renamed, so a reader never sees a partial file and a crash
//     leaves at most a temporary file, which the next Extract removes.
//   - The file is owned by the extracting user (root for the daemon) and
//     read-only (0555), in a directory only its owner may write (0711).
//   - Resolve asks the fence binary at the given path, not the running
//     process: a test or tool that runs backends in-process finds the
//     binary that fence binary carries.
package embedded

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Arg is the argument with which the fence binary extracts the in-sandbox
// binary it carries into the directory given next, prints its path (or
// nothing when it carries none) and exits.
const Arg = "__fence-sandbox-binary"

// prefix names extracted binaries: prefix + the first 16 hex digits of
// their SHA-256.
const prefix = "fence-sandbox-"

// staleAfter is how long an extracted binary of another build is kept
// after its last use (another daemon of another build may still run it).
const staleAfter = 7 * 24 * time.Hour

// Present reports whether this binary carries the in-sandbox binary.
func Present() bool { return len(binary) > 0 }

// Extract writes the carried in-sandbox binary into dir (made if missing)
// and returns its path, or "" when this binary carries none.
func Extract(dir string) (string, error) {
	if !Present() {
		return "", nil
	}
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", err
	}
	collect(dir)
	return Keep(dir, prefix, bytes.NewReader(binary))
}

// Keep writes what src holds into dir under prefix + the first 16 hex
// digits of its SHA-256, read-only (0555), unless a file of that name is
// there already (whose mtime it then moves to now), and returns its path.
// The file appears whole or not at all: written to a temporary name,
// synced and renamed.
func Keep(dir, prefix string, src io.ReadSeeker) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", fmt.Errorf("reading %s: %w", prefix, err)
	}
	name := prefix + hex.EncodeToString(h.Sum(nil)[:8])
	path := filepath.Join(dir, name)
	if _, err := os.Stat(path); err == nil {
		now := time.Now()
		_ = os.Chtimes(path, now, now) // in use: not stale
		return path, nil
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, src)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	return path, nil
}

// collect removes temporary files of crashed extractions and binaries of
// other builds unused for staleAfter (the one in use has its mtime moved
// to now at each Extract).
func collect(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, ".tmp-"):
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Hour {
				os.Remove(filepath.Join(dir, n))
			}
		case strings.HasPrefix(n, prefix):
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleAfter {
				os.Remove(filepath.Join(dir, n))
			}
		}
	}
}

// Resolve returns the in-sandbox binary the fence binary at exe carries,
// extracted into dir, or exe itself when it carries none.
func Resolve(ctx context.Context, exe, dir string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, Arg, dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("extracting the in-sandbox binary from %s: %w: %s", exe, err, bytes.TrimSpace(stderr.Bytes()))
	}
	path := strings.TrimSpace(string(out))
	if path == "" {
		return exe, nil
	}
	if !filepath.IsAbs(path) || filepath.Dir(path) != filepath.Clean(dir) {
		return "", fmt.Errorf("extracting the in-sandbox binary from %s: unexpected answer %q", exe, path)
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("extracting the in-sandbox binary from %s: %s is missing", exe, path)
	}
	return path, nil
}

// Main is the Arg role: args are what follows Arg.
func Main(args []string) int {
	if len(args) != 1 || !filepath.IsAbs(args[0]) {
		fmt.Fprintf(os.Stderr, "usage: fence %s ABSOLUTE-DIR\n", Arg)
		return 2
	}
	p, err := Extract(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fence:", err)
		return 1
	}
	if p != "" {
		fmt.Println(p)
	}
	return 0
}
