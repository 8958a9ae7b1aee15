package policy

import "net/netip"

func mustPrefixes(ss ...string) []netip.Prefix {
	ps := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		ps[i] = netip.MustParsePrefix(s)
	}
	return ps
}

// neverReachable are ranges no rule can open. Cloud metadata and platform
// endpoints over IPv4 are link-local (169.254.169.254 on AWS, GCP, Azure,
// OCI, OpenStack, DigitalOcean and others; 169.254.0.23 Tencent;
// 169.254.42.42 Scaleway; 169.254.170.2/.23 ECS and EKS) except the ones
// listed one by one.
var neverReachable = mustPrefixes(
	"0.0.0.0/8",              // "this network", unspecified
	"127.0.0.0/8",            // loopback
	"169.254.0.0/16",         // link-local: 169.254.169.254 metadata, 169.254.170.2 ECS credentials
	"100.100.100.200/32",     // Alibaba Cloud metadata
	"168.63.129.16/32",       // Azure WireServer and platform DNS (a public address)
	"192.0.0.0/24",           // IETF protocol assignments (incl. 192.0.0.192 OCI metadata)
	"224.0.0.0/4",            // multicast
	"240.0.0.0/4",            // reserved, 255.255.255.255 broadcast
	"::/128",                 // unspecified
	"::1/128",                // loopback
	"::/96",                  // deprecated IPv4-compatible
	"fe80::/10",              // link-local
	"fec0::/10",              // deprecated site-local
	"ff00::/8",               // multicast
	"fd00:ec2::254/128",      // AWS IMDS over IPv6
	"fd00:ec2::253/128",      // AWS Route 53 Resolver over IPv6
	"fd00:ec2::123/128",      // AWS Time Sync over IPv6
	"fd00:ec2::23/128",       // AWS EKS Pod Identity agent over IPv6
	"fd20:ce::254/128",       // Google Cloud metadata over IPv6
	"fd00:c1::a9fe:a9fe/128", // Oracle Cloud metadata over IPv6
	"fd00:42::42/128",        // Scaleway metadata over IPv6
	"2001::/32",              // Teredo: tunnels to arbitrary IPv4
	"100::/64",               // discard-only
)

// private ranges are reachable only through an allow CIDR rule inside them.
var private = mustPrefixes(
	"10.0.0.0/8",
	"172.16.0.0/12",
	"192.168.0.0/16",
	"100.64.0.0/10", // CGNAT (Tailscale and friends)
	"198.18.0.0/15", // benchmarking, often used for internal fabrics
	"fc00::/7",      // unique local
)

var (
	nat64   = netip.MustParsePrefix("64:ff9b::/96")
	nat64l  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixto4  = netip.MustParsePrefix("2002::/16")
	mapped4 = netip.MustParsePrefix("::ffff:0:0/96")
)

// classify returns the address to judge (the embedded IPv4 address of an
// IPv4-mapped, NAT64 or 6to4 address, without zone) and whether it is
// never reachable.
func classify(addr netip.Addr) (netip.Addr, bool) {
	if !addr.IsValid() {
		return addr, true
	}
	a := addr.WithZone("")
	if a.Is6() {
		b := a.As16()
		switch {
		case mapped4.Contains(a):
			a = a.Unmap()
		case nat64.Contains(a):
			a = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
		case nat64l.Contains(a):
			// RFC 8215 local-use NAT64: the IPv4 address may sit anywhere;
			// there is no safe way to judge it.
			return a, true
		case sixto4.Contains(a):
			a = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		}
	}
	for _, p := range neverReachable {
		if p.Contains(a) {
			return a, true
		}
	}
	return a, false
}

func privateRange(a netip.Addr) (netip.Prefix, bool) {
	for _, p := range private {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
