package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/fencesandbox/fence/api"
)

// AllTraffic is E2B's ALL_TRAFFIC: the denyOut entry that blocks every
// destination no allowOut entry names.
const AllTraffic = "0.0.0.0/0"

// allTraffic6 is its IPv6 counterpart: fence has IPv6 egress, E2B has
// none, so a deny of 0.0.0.0/0 also denies ::/0. "::/0" is accepted
// wherever "0.0.0.0/0" is.
const allTraffic6 = "::/0"

// ErrDomainsNeedDenyAll is E2B's answer to an allowOut that names a
// domain while denyOut does not hold ALL_TRAFFIC.
//
//lint:ignore ST1005 E2B's wording, which the e2b SDKs show as it is.
var ErrDomainsNeedDenyAll = errors.New("When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other traffic.")

// FromE2B translates E2B's allow_internet_access and network lists into a
// Spec (without HostAddrs, which the caller adds), with E2B's semantics
// and validation:
//
//   - allowOut entries are exceptions to denyOut, not an allowlist. A flow
//     is allowed when an allowOut name or CIDR covers it, else blocked
//     when a denyOut CIDR covers it, else allowed (the default is open).
//   - denyOut entries must be addresses or CIDRs ("invalid denied CIDR
//     x"); an unspecified address is refused, except 0.0.0.0/0 itself.
//   - allowOut addresses and CIDRs must be specified (0.0.0.0/0 is
//     accepted); anything else is a name ("example.com", "*.example.com",
//     "*") or a registry preset ("@pypi", see [Presets]).
//   - an allowOut that names a domain requires 0.0.0.0/0 in denyOut
//     ([ErrDomainsNeedDenyAll]), checked on the lists as given.
//   - allow_internet_access false replaces denyOut with 0.0.0.0/0;
//     allowOut exceptions still apply. true or nil changes nothing.
//   - 0.0.0.0/0 in the deny list also denies ::/0, and makes the default
//     deny: names no allowOut entry covers do not even resolve.
//     0.0.0.0/0 in allowOut (the JS SDK's allTraffic) allows ::/0 too and
//     wins over every deny CIDR.
//
// fence's additions are kept: ports ("example.com:443", see
// [ParseTarget]), the never-reachable and private ranges of [Compile], and
// the name verification of flows admitted by name. The caller decides the
// default of a request that says nothing about its network.
func FromE2B(allowInternet *bool, n *api.NetworkConfig) (Spec, error) {
	var allowOut, denyOut []string
	if n != nil {
		allowOut, denyOut = n.AllowOut, n.DenyOut
	}
	var spec Spec
	denyAll := false
	for _, s := range denyOut {
		r, err := parseDenied(s)
		if err != nil {
			return Spec{}, err
		}
		if isAllTraffic(r) {
			denyAll = true
		}
		spec.Deny = append(spec.Deny, r)
	}
	domains, allowAll := false, false
	for _, s := range allowOut {
		rs, isName, err := parseAllowed(s)
		if err != nil {
			return Spec{}, err
		}
		domains = domains || isName
		for _, r := range rs {
			spec.Allow = append(spec.Allow, r)
			if isAllTraffic(r) {
				allowAll = true
				if r.Prefix.Addr().Is4() {
					spec.Allow = append(spec.Allow, Rule{Prefix: netip.MustParsePrefix(allTraffic6)})
				}
			}
		}
	}
	if domains && !denyAll {
		return Spec{}, ErrDomainsNeedDenyAll
	}
	if allowInternet != nil && !*allowInternet {
		spec.Deny, denyAll = nil, true
	}
	if denyAll && !allowAll {
		// Every address no allow rule covers is denied: the default is
		// deny, and the deny rules left would only repeat it.
		var keep []Rule
		for _, r := range spec.Deny {
			if len(r.Ports) > 0 {
				keep = append(keep, r)
			}
		}
		spec.Deny = keep
		spec.AllowAll = false
		return spec, nil
	}
	spec.AllowAll = true
	for _, r := range spec.Deny {
		if r.Prefix == netip.MustParsePrefix(AllTraffic) {
			spec.Deny = append(spec.Deny, Rule{Prefix: netip.MustParsePrefix(allTraffic6), Ports: r.Ports})
		}
	}
	return spec, nil
}

// isAllTraffic reports whether r denies every IPv4 destination on every
// port.
func isAllTraffic(r Rule) bool {
	return len(r.Ports) == 0 && r.Prefix.IsValid() && r.Prefix.Bits() == 0
}

// parseDenied parses a denyOut entry: an address or CIDR (with fence's
// optional ports).
func parseDenied(s string) (Rule, error) {
	r, err := ParseTarget(s)
	if err != nil || r.Name != "" {
		return Rule{}, fmt.Errorf("invalid denied CIDR %s", s)
	}
	if r.Prefix.Addr().IsUnspecified() && !allTrafficForm(s) {
		return Rule{}, fmt.Errorf("invalid denied CIDR %s: unspecified address", s)
	}
	return r, nil
}

// parseAllowed parses an allowOut entry; isName is true for a domain or
// a preset. A preset gives one rule per name it lists.
func parseAllowed(s string) (rs []Rule, isName bool, err error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "@") {
		names, ok := Presets[strings.ToLower(t)]
		if !ok {
			return nil, false, fmt.Errorf("invalid allowed entry %s: unknown preset (known: %s)", s, presetList())
		}
		for _, n := range names {
			rs = append(rs, Rule{Name: n})
		}
		return rs, true, nil
	}
	r, err := ParseTarget(t)
	if err != nil {
		return nil, false, fmt.Errorf("invalid allowed entry %s: %w", s, err)
	}
	if r.Name != "" {
		return []Rule{r}, true, nil
	}
	if r.Prefix.Addr().IsUnspecified() && !allTrafficForm(t) {
		return nil, false, fmt.Errorf("invalid allowed CIDR %s: unspecified address", s)
	}
	return []Rule{r}, false, nil
}

// allTrafficForm reports whether s is 0.0.0.0/0 or ::/0, with or without
// ports.
func allTrafficForm(s string) bool {
	s = strings.TrimSpace(s)
	for _, all := range []string{AllTraffic, allTraffic6, "[" + allTraffic6 + "]"} {
		if s == all || strings.HasPrefix(s, all+":") {
			return true
		}
	}
	return false
}

func presetList() string {
	names := make([]string, 0, len(Presets))
	for k := range Presets {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
