package egress

import (
	"context"
	"net"
	"net/netip"
)

// Interceptor takes over the flows a sandbox's egress gateway must see
// inside: TLS flows it terminates (header rules, secrets, inspection,
// download records) and plain-HTTP flows it relays request by request.
// The stack asks it only about flows the policy already allowed; the
// interceptor then decides every request on its own.
type Interceptor interface {
	// InterceptTLS reports whether a TLS flow whose ClientHello names sni
	// is terminated by the gateway. false leaves the flow to the relay,
	// which passes it through untouched.
	InterceptTLS(sni string) bool
	// InterceptHTTP reports whether a plain-HTTP flow whose first request
	// names host goes through the gateway.
	InterceptHTTP(host string) bool
	// Serve relays one intercepted flow until it ends and returns the
	// bytes it carried up (sandbox to upstream) and down.
	Serve(ctx context.Context, f InterceptedFlow) (out, in int64)
}

// InterceptedFlow is one flow handed to an Interceptor.
type InterceptedFlow struct {
	// Conn is the sandbox's side. The bytes the stack peeked at (the
	// ClientHello, the first request head) are read from it first.
	Conn net.Conn
	// Upstream is already connected to Dst (through the sandbox's egress
	// proxy, if it has one). The interceptor owns it: it uses it for its
	// first upstream connection or closes it.
	Upstream net.Conn
	// Dial connects to Dst again, the same way.
	Dial func(ctx context.Context) (net.Conn, error)
	// Dst is the destination the sandbox connected to and the policy
	// allowed. The gateway never connects anywhere else.
	Dst netip.AddrPort
	// Names are the names the sandbox's resolver handed out Dst for.
	Names []string
	// SNI is the TLS server name (normalised); empty for plain HTTP.
	SNI string
}
