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
	sum := sha256.Sum256(binary)
	name := prefix + hex.EncodeToString(sum[:8])
	path := filepath.Join(dir, name)
	collect(dir, name)
	if b, err := os.ReadFile(path); err == nil && bytes.Equal(b, binary) {
		now := time.Now()
		_ = os.Chtimes(path, now, now) // in use: not stale
		return path, nil
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("writing the in-sandbox binary: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(binary); err != nil {
		tmp.Close()
		return "", fmt.Errorf("writing the in-sandbox binary: %w", err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("writing the in-sandbox binary: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("writing the in-sandbox binary: %w", err)
	}
	return path, nil
}

// collect removes temporary files of crashed extractions and binaries of
// other builds unused for staleAfter.
func collect(dir, keep string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		n := e.Name()
		switch {
		case n == keep:
		case strings.HasPrefix(n, ".tmp-"+prefix):
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
