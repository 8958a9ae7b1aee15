package tbuild

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"regexp"
	"strings"
)

// hashRE matches a COPY step's files hash.
var hashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// hashKeys is the cache-key chain: sha256 of the keys, each one prefixed
// by its length, so that no two different lists of keys share a key.
func hashKeys(keys ...string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, k := range keys {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(k)))])
		h.Write([]byte(k))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// stepKey is the cache key of a build step after the key prev: its type,
// its arguments (each one length-prefixed, so ["x","root"] and ["x root"]
// differ), the files hash its client named and, for a COPY, the digest of
// the files fence holds under that hash (filesDigest).
func stepKey(prev, typ string, args []string, filesHash, filesDigest string) string {
	return hashKeys(prev, typ, hashKeys(args...), filesHash, filesDigest)
}

// shellQuote quotes s for a POSIX shell, leaving safe strings bare
// (Python's shlex.quote).
func shellQuote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_@%+=:,./-", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}
