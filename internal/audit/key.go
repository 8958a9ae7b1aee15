package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/fencesandbox/fence/internal/keyfile"
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
	b, err := keyfile.ReadPrivate(path, 256)
	if errors.Is(err, fs.ErrNotExist) {
		return createKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	seed, err := hex.DecodeString(strings.TrimSpace(string(b)))
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
	err := keyfile.CreatePrivate(path, []byte(hex.EncodeToString(seed)+"\n"))
	if errors.Is(err, fs.ErrExist) {
		return loadOrCreateKey(path) // made meanwhile: use that one
	}
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
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
	return keyfile.WriteAtomic(path, b, mode)
}

func syncDir(dir string) { keyfile.SyncDir(dir) }
