// Package egress is a sandbox's only way out: a user-space TCP/IP stack
// (gVisor netstack) on the daemon side of the sandbox's TUN device that
// terminates every TCP flow and UDP datagram the sandbox sends, decides
// per flow with [policy.Policy], and dials allowed destinations itself
// from the host.
//
// # Addressing
//
// The sandbox's network namespace has one interface, a TUN device whose
// other end is this stack, configured with [SandboxIPv4] and [SandboxIPv6]
// and default routes for both families via the device (no neighbour
// discovery: TUN is layer 3). The stack owns [GatewayIPv4]/[GatewayIPv6]
// (source of ingress connections) and [ResolverIPv4]/[ResolverIPv6] (the
// only DNS server the sandbox can reach, UDP and TCP port 53; put it in
// the sandbox's resolv.conf). Every other destination address is
// intercepted (promiscuous NIC), so the sandbox needs no gateway address.
//
// # What it guarantees
//
//   - A TCP connection is allowed or refused (RST) before the sandbox's
//     handshake completes: the upstream is dialed first and the handshake
//     is completed only if that dial succeeded.
//   - When a flow is allowed only because its destination address was
//     handed out by the sandbox's resolver for an allowed name, no byte
//     from the sandbox is forwarded before the stack has peeked at the
//     stream: it must be a TLS ClientHello whose SNI is an allowed name
//     the destination address was handed out for (see [policy.Decision]),
//     or HTTP/1.x, whose every request is checked the same way (below). A
//     ClientHello without SNI is refused, and so is a client that speaks
//     first with anything else ([ReasonNotHTTP]). A client that sends
//     nothing within [Options.PeekTimeout] is refused unless the upstream
//     has spoken first (SSH, SMTP): such a server-first stream is judged
//     by the resolver record alone, unless its first line names an HTTP
//     version, which makes it HTTP.
//   - Plain HTTP on such a flow is checked request by request for as long
//     as the connection lives ([sniff.HTTPStream]): keep-alive,
//     pipelining, any method, blank lines between requests (dropped) and
//     absolute-form targets. Each request head (at most
//     [sniff.MaxHTTPHead]) is read whole and its Host decided by the
//     policy before any byte of it leaves; bodies are framed by
//     Content-Length or chunked encoding and pass through in large
//     chunks. Ambiguous framing (the request smuggling toolkit), a
//     missing, repeated or IP-literal Host, CONNECT, HTTP/2 prior
//     knowledge and h2c upgrades end the flow ([ReasonSniff],
//     [ReasonNoName], [ReasonConnect], [ReasonHTTP2], [ReasonUpgrade] or
//     the policy's reason). A WebSocket upgrade is allowed only as the
//     first request; the stream becomes opaque only when the server's
//     first answer is a 101. Flows allowed by address that are peeked
//     because deny name rules exist get the same per-request check (a
//     stream whose first line names no HTTP version passes there);
//     flows allowed by a CIDR rule without deny name rules pass unparsed.
//   - A refused flow is reset (RST) and recorded with the sandbox ID, the
//     name it tried ([FlowEvent.Observed]) and the reason.
//   - UDP: only DNS to the resolver address is answered; every other
//     datagram is dropped. ICMP and IPv6 packets with extension headers
//     are dropped on arrival, as are packets whose source is not in the
//     sandbox's prefix. Nothing but the daemon's own dial ever leaves the
//     host on the sandbox's behalf.
//   - Each flow and each DNS query produces one [FlowEvent] for the
//     [Recorder] (TCP flows when they end, with bytes and duration).
//
// # What it does not do
//
// It does not create the TUN device or configure the sandbox side (see
// [Options.FD] and the backend). It does not intercept TLS: after the
// first ClientHello a TLS stream is opaque, and so it cannot
// tell apart two names served from the same address with the same
// certificate (HTTP/2 coalescing, domain fronting): those are accepted
// risks for allowed names. IPv6 fragments are dropped. Policy changes
// ([Stack.SetPolicy]) apply to new flows; flows already open continue.
//
// Without TLS interception these stay open: an allowed SNI followed by
// another site's Host inside TLS, HTTP/2 connection coalescing across
// names that share a certificate, and whatever follows a WebSocket 101 or
// a server-first banner. An inspecting gateway that terminates TLS is
// what closes them. Later requests on an open flow are checked against
// the policy and resolver records the flow started with.
//
// # Usage
//
//	st, err := egress.New(ctx, egress.Options{SandboxID: id, FD: tunFD, Policy: pol,
//		DNSUpstream: "127.0.0.53:53", HostAddrs: hostAddrs, Recorder: rec})
//	...
//	conn, err := st.DialSandbox(ctx, 49983) // ingress to the agent
//	...
//	st.Close() // closes the TUN fd and every flow
package egress
