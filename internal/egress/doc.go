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
//     stream: a TLS SNI or HTTP Host must name an allowed name that the
//     destination address was handed out for (see [policy.Decision]); a
//     ClientHello without SNI or a request without Host is refused. A
//     stream that is neither TLS nor HTTP is judged by the resolver
//     record alone. A client that sends nothing within
//     [Options.PeekTimeout] is refused unless the upstream has spoken
//     first (SSH, SMTP), in which case its first bytes are still checked.
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
// [Options.FD] and the lead's backend), does not intercept TLS, does not
// see requests after the first one on a kept-alive connection, and cannot
// tell apart two names served from the same address with the same
// certificate (HTTP/2 coalescing, domain fronting): those are accepted
// risks for allowed names. IPv6 fragments are dropped. Policy changes
// ([Stack.SetPolicy]) apply to new flows; flows already open continue.
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
