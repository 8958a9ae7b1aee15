package tbuild

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/fencesandbox/fence/api"
)

var (
	aliasRE = regexp.MustCompile(`^[a-z0-9_-]+$`)
	tagRE   = regexp.MustCompile(`^[a-z0-9_.-]+$`)
	uuidRE  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	hashRE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// DefaultTag is the tag a name without one means.
const DefaultTag = "default"

// Name is a parsed template reference: [namespace/]alias[:tag].
type Name struct {
	Namespace string
	Alias     string
	Tag       string // "" means DefaultTag
}

// ParseName parses "alias", "alias:tag" or "ns/alias[:tag]" as E2B does:
// trimmed, split at the first ':' and then the first '/', lower-cased;
// the tag "default" counts as none. A malformed name wraps
// api.ErrInvalidArgument.
func ParseName(s string) (Name, error) {
	s = strings.TrimSpace(s)
	var n Name
	rest, tag, hasTag := strings.Cut(s, ":")
	if hasTag {
		n.Tag = strings.ToLower(strings.TrimSpace(tag))
		if !tagRE.MatchString(n.Tag) {
			return Name{}, fmt.Errorf("invalid tag %q in template name %q (want [a-z0-9_.-]+): %w", tag, s, api.ErrInvalidArgument)
		}
		if n.Tag == DefaultTag {
			n.Tag = ""
		}
	}
	if ns, alias, ok := strings.Cut(rest, "/"); ok {
		n.Namespace = strings.ToLower(strings.TrimSpace(ns))
		rest = alias
		if !aliasRE.MatchString(n.Namespace) {
			return Name{}, fmt.Errorf("invalid namespace %q in template name %q (want [a-z0-9_-]+): %w", ns, s, api.ErrInvalidArgument)
		}
	}
	n.Alias = strings.ToLower(strings.TrimSpace(rest))
	if len(n.Alias) > 128 || !aliasRE.MatchString(n.Alias) {
		return Name{}, fmt.Errorf("invalid template name %q (want [a-z0-9_-]+, at most 128 bytes): %w", s, api.ErrInvalidArgument)
	}
	return n, nil
}

// TagOrDefault is the tag, or DefaultTag when none was given.
func (n Name) TagOrDefault() string {
	if n.Tag == "" {
		return DefaultTag
	}
	return n.Tag
}

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
