package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Files in the data dir.
const (
	// KeyFile holds the checkpoint signing key (hex Ed25519 seed), 0600.
	KeyFile = "audit-key"
	// PubFile holds the public key verifiers check checkpoints with (hex).
	PubFile = "audit.pub"
	// LogDir is the directory of segments, the head and the outputs.
	LogDir = "audit"
)

// checkpointMessage is what a checkpoint signs: a domain label, the seq of
// the record it covers and that record's line hash.
func checkpointMessage(seq uint64, hash []byte) []byte {
	m := make([]byte, 0, 32+8+len(hash))
	m = append(m, "fence-audit-checkpoint-v1\x00"...)
	m = binary.BigEndian.AppendUint64(m, seq)
	return append(m, hash...)
}

// keyID names a public key in checkpoints: the first 8 bytes of its
// SHA-256, hex.
func keyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:8])
}

// loadOrCreateKey returns the signing key at path, creating it (0600,
// atomically) if absent. A key that is a symlink, not a regular file, not
// owned by this user or readable by group or others is refused.
func loadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return createKey(path)
	}
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("audit key %s is a symlink: refused", path)
	}
	if err != nil {
		return nil, fmt.Errorf("opening audit key: %w", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("audit key %s is not a regular file: refused", path)
	}
	if st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("audit key %s is readable by group or others (mode %#o): refused; chmod 600 it or remove it", path, st.Mode&0o777)
	}
	if int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("audit key %s is owned by uid %d, not %d: refused", path, st.Uid, os.Geteuid())
	}
	b := make([]byte, 256)
	n, _ := f.Read(b)
	seed, err := hex.DecodeString(strings.TrimSpace(string(b[:n])))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("audit key %s does not hold a hex Ed25519 seed", path)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

func createKey(path string) (ed25519.PrivateKey, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".audit-key-*")
	if err != nil {
		return nil, fmt.Errorf("creating audit key: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes it 0600 already; say so anyway.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, err
	}
	if _, err := tmp.WriteString(hex.EncodeToString(seed) + "\n"); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("writing audit key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	// Link, not rename: a key that appeared meanwhile is never replaced.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return loadOrCreateKey(path)
		}
		return nil, fmt.Errorf("installing audit key: %w", err)
	}
	syncDir(filepath.Dir(path))
	return ed25519.NewKeyFromSeed(seed), nil
}

// writePub writes the public key for verifiers (0644), atomically.
func writePub(path string, pub ed25519.PublicKey) error {
	return writeFileAtomic(path, []byte(hex.EncodeToString(pub)+"\n"), 0o644)
}

// LoadPublicKey reads a public key file as written to DATA-DIR/audit.pub.
func LoadPublicKey(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s does not hold a hex Ed25519 public key", path)
	}
	return ed25519.PublicKey(k), nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	syncDir(filepath.Dir(path))
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
