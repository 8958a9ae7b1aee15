package policy

import (
	"fmt"
	"net/netip"

	"github.com/fencesandbox/fence/api"
)

// FromE2B translates E2B's allow_internet_access and SandboxNetworkConfig
// into a Spec (without HostAddrs, which the caller adds):
//
//   - no lists, allow_internet_access absent or true: allow all;
//   - allow_internet_access false: deny all (E2B: denyOut ["0.0.0.0/0"]);
//   - allowOut entries are allow rules and win over denyOut (E2B order);
//   - a non-empty allowOut makes the default deny-all, even with
//     allow_internet_access true. E2B would still allow everything not in
//     denyOut; fence treats an allowlist as an allowlist (default deny);
//   - a denyOut entry of 0.0.0.0/0 (E2B's ALL_TRAFFIC) also denies ::/0.
func FromE2B(allowInternet *bool, n *api.NetworkConfig) (Spec, error) {
	var spec Spec
	allow := allowInternet == nil || *allowInternet
	if n != nil {
		for _, s := range n.AllowOut {
			r, err := ParseTarget(s)
			if err != nil {
				return Spec{}, fmt.Errorf("parsing allowOut entry %q: %w", s, err)
			}
			spec.Allow = append(spec.Allow, r)
		}
		for _, s := range n.DenyOut {
			r, err := ParseTarget(s)
			if err != nil {
				return Spec{}, fmt.Errorf("parsing denyOut entry %q: %w", s, err)
			}
			spec.Deny = append(spec.Deny, r)
			if r.Prefix == netip.MustParsePrefix("0.0.0.0/0") {
				spec.Deny = append(spec.Deny, Rule{Prefix: netip.MustParsePrefix("::/0")})
			}
		}
		if len(n.AllowOut) > 0 {
			allow = false
		}
	}
	spec.AllowAll = allow
	return spec, nil
}
