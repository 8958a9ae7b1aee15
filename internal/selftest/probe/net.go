package probe

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// dialTimeout bounds each connection attempt. The sandbox's network stack
// answers a refused SYN with a reset at once; a timeout is a refusal too.
const dialTimeout = 5 * time.Second

// connectRefused connects to each ADDR:PORT argument over TCP; a
// connection that opens is an escape.
func connectRefused(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: want at least one ADDR:PORT", errUsage)
	}
	for _, a := range args {
		if _, err := netip.ParseAddrPort(a); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	for _, a := range args {
		c, err := net.DialTimeout("tcp", a, dialTimeout)
		if err == nil {
			c.Close()
			return escapef("connected to %s", a)
		}
	}
	return nil
}

// checkDNS asks the sandbox's resolver (its /etc/resolv.conf) for NAME.
func checkDNS(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%w: want one NAME", errUsage)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*dialTimeout)
	defer cancel()
	r := &net.Resolver{PreferGo: true}
	addrs, err := r.LookupHost(ctx, args[0])
	if err == nil {
		return escapef("%s resolved to %v", args[0], addrs)
	}
	return nil
}
