package names

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/fencesandbox/fence/api"
)

var (
	aliasRE = regexp.MustCompile(`^[a-z0-9_-]+$`)
	tagRE   = regexp.MustCompile(`^[a-z0-9_.-]+$`)
	uuidRE  = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
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

// IsUUID reports whether s is a build ID (a UUID), which a tag may not be.
func IsUUID(s string) bool { return uuidRE.MatchString(s) }

// CleanTag lower-cases and trims a tag; ok is false unless it is
// [a-z0-9_.-]+ and not a UUID.
func CleanTag(t string) (clean string, ok bool) {
	t = strings.ToLower(strings.TrimSpace(t))
	return t, tagRE.MatchString(t) && !uuidRE.MatchString(t)
}
