package secrets

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
)

// IDPrefix starts every secret ID; names may not start with it.
const IDPrefix = "sec_"

// alphabet is typeid's: Crockford's base32 in lower case.
const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

// suffixLen is the length of a typeid suffix: 128 bits in 5-bit digits,
// the first digit holding the top 3 bits (so it is at most '7').
const suffixLen = 26

// newID returns sec_ and the typeid suffix of a fresh UUIDv7 (RFC 9562:
// 48 bits of Unix milliseconds, version 7, 74 random bits, variant 10).
func newID(now time.Time) (string, error) {
	var u [16]byte
	if _, err := rand.Read(u[6:]); err != nil {
		return "", fmt.Errorf("generating secret ID: %w", err)
	}
	ms := uint64(now.UnixMilli())
	u[0], u[1], u[2], u[3], u[4], u[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	u[6] = u[6]&0x0f | 0x70
	u[8] = u[8]&0x3f | 0x80
	return IDPrefix + encodeSuffix(u), nil
}

// encodeSuffix encodes a UUID as a typeid suffix: the 128 bits as 26
// base32 digits, most significant first.
func encodeSuffix(u [16]byte) string {
	hi, lo := binary.BigEndian.Uint64(u[:8]), binary.BigEndian.Uint64(u[8:])
	var b [suffixLen]byte
	for i := suffixLen - 1; i >= 0; i-- {
		b[i] = alphabet[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(b[:])
}

// decodeSuffix parses a typeid suffix back into its UUID.
func decodeSuffix(s string) ([16]byte, bool) {
	var u [16]byte
	if len(s) != suffixLen || s[0] > '7' {
		return u, false
	}
	var hi, lo uint64
	for i := 0; i < len(s); i++ {
		d := strings.IndexByte(alphabet, s[i])
		if d < 0 {
			return u, false
		}
		hi = hi<<5 | lo>>59
		lo = lo<<5 | uint64(d)
	}
	binary.BigEndian.PutUint64(u[:8], hi)
	binary.BigEndian.PutUint64(u[8:], lo)
	return u, true
}

// validID reports whether id is sec_ and a typeid suffix.
func validID(id string) bool {
	suffix, ok := strings.CutPrefix(id, IDPrefix)
	if !ok {
		return false
	}
	_, ok = decodeSuffix(suffix)
	return ok
}

// maxNameLen bounds a secret name, in bytes.
const maxNameLen = 128

// Name returns the canonical (lower-case) form of a secret name, or an
// error wrapping api.ErrInvalidArgument: names are 1..128 of
// [A-Za-z0-9_-] and do not start with sec_ (in any case).
func Name(name string) (string, error) {
	if len(name) == 0 || len(name) > maxNameLen {
		return "", fmt.Errorf("a secret name has 1 to %d characters: %w", maxNameLen, api.ErrInvalidArgument)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return "", fmt.Errorf("a secret name holds only letters, digits, _ and -: %w", api.ErrInvalidArgument)
		}
	}
	name = strings.ToLower(name)
	if strings.HasPrefix(name, IDPrefix) {
		return "", fmt.Errorf("a secret name may not start with %s: %w", IDPrefix, api.ErrInvalidArgument)
	}
	return name, nil
}

// selector is what a {secretID} path value names: an ID or a name.
type selector struct {
	id, name string // exactly one is set
}

// parseSelector applies the selector rule: after trimming spaces and
// lower-casing, a value starting with sec_ is an ID (an invalid one is an
// error wrapping api.ErrInvalidArgument); anything else is a name.
func parseSelector(s string) (selector, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if strings.HasPrefix(s, IDPrefix) {
		if !validID(s) {
			return selector{}, fmt.Errorf("malformed secret ID: %w", api.ErrInvalidArgument)
		}
		return selector{id: s}, nil
	}
	name, err := Name(s)
	if err != nil {
		return selector{}, err
	}
	return selector{name: name}, nil
}
