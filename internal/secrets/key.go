package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// keyLen is the length of the key file: an AES-256 key.
const keyLen = 32

// errNoKey is returned by readKey when the key file does not exist.
var errNoKey = errors.New("no key file")

// readKey reads the key file. It refuses a file that is not a regular
// file, is not owned by this process's user, or that its group or others
// may access at all: a key anyone else can read protects nothing.
func readKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errNoKey
	}
	if err != nil {
		return nil, fmt.Errorf("opening secrets key %s: %w", path, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("checking secrets key %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("secrets key %s is not a regular file", path)
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("secrets key %s is owned by uid %d, not by this daemon's uid %d", path, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return nil, fmt.Errorf("secrets key %s has mode %04o: refusing a key its group or others may access (chmod 600 it, and rotate it if it leaked)", path, st.Mode&0o7777)
	case st.Size != keyLen:
		return nil, fmt.Errorf("secrets key %s holds %d bytes, want %d", path, st.Size, keyLen)
	}
	key := make([]byte, keyLen)
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, fmt.Errorf("reading secrets key %s: %w", path, err)
	}
	return key, nil
}

// createKey makes a new key file of 32 random bytes, mode 0600. It is
// written whole under a temporary name and then linked into place, so the
// key file is never seen partly written, and a key file made meanwhile is
// never replaced: the link fails and the caller reads that one.
func createKey(path string) error {
	key := make([]byte, keyLen)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("generating secrets key: %w", err)
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("generating secrets key: %w", err)
	}
	tmp := path + ".tmp-" + hex.EncodeToString(rnd[:])
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating secrets key: %w", err)
	}
	defer os.Remove(tmp)
	_, err = f.Write(key)
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
		return fmt.Errorf("writing secrets key: %w", err)
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("installing secrets key: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
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
