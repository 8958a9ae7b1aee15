package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"strconv"

	"github.com/fencesandbox/fence/internal/keyfile"
)

// keyLen is the length of the key file: an AES-256 key.
const keyLen = 32

// errNoKey is returned by readKey when the key file does not exist.
var errNoKey = errors.New("no key file")

// readKey reads the key file (see keyfile.ReadPrivate for what is
// refused: a key anyone else can read protects nothing).
func readKey(path string) ([]byte, error) {
	key, err := keyfile.ReadPrivate(path, keyLen)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errNoKey
	}
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	if len(key) != keyLen {
		return nil, fmt.Errorf("secrets key %s holds %d bytes, want %d", path, len(key), keyLen)
	}
	return key, nil
}

// createKey makes a new key file of 32 random bytes, mode 0600, never
// seen partly written; a key file made meanwhile is kept and the caller
// reads that one.
func createKey(path string) error {
	key := make([]byte, keyLen)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("generating secrets key: %w", err)
	}
	if err := keyfile.CreatePrivate(path, key); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("secrets key: %w", err)
	}
	return nil
}

// newAEAD returns AES-256-GCM with key.
func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// additionalData binds a sealed value to one secret's ID and version, so
// a sealed value copied to another row, or kept from another version,
// fails to open.
func additionalData(id string, version int64) []byte {
	return []byte("fence-secret-v1\x00" + id + "\x00" + strconv.FormatInt(version, 10))
}

// seal encrypts value with a fresh random nonce: nonce || ciphertext.
func seal(aead cipher.AEAD, id string, version int64, value string) ([]byte, error) {
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(value)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("generating nonce: %w", err)
	}
	return aead.Seal(nonce, nonce, []byte(value), additionalData(id, version)), nil
}

// open decrypts what seal made for the same ID and version.
func open(aead cipher.AEAD, id string, version int64, sealed []byte) (string, error) {
	n := aead.NonceSize()
	if len(sealed) < n+aead.Overhead() {
		return "", errors.New("sealed value is truncated")
	}
	plain, err := aead.Open(nil, sealed[:n], sealed[n:], additionalData(id, version))
	if err != nil {
		return "", errors.New("sealed value does not open with this key for this secret and version")
	}
	return string(plain), nil
}
