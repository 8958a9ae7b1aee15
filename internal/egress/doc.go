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
// # Budgets
//
// Nothing a sandbox does makes the daemon hold more than a fixed amount of
// memory, or spend more than a fixed share of a core, on its behalf:
//
//   - TCP buffers start small (64 KiB) and grow only while data moves, to
//     256 KiB per direction. Every egress flow is charged its worst case
//     up front to the sandbox's share of a daemon-wide [Shared] budget: a
//     full flow 864 KiB (both buffers full, a 64 KiB relay buffer
//     towards the upstream and a 256 KiB one towards the sandbox,
//     goroutines and state), a small one 192 KiB (buffers fixed at
//     16 KiB, 64 KiB relay buffers). A full flow that has moved 1 MiB
//     towards the sandbox gets a 2 MiB send buffer if its share can pay
//     the 1,792 KiB more, charged until it ends. Full flows may take half of the share (64 MiB by default),
//     small ones the rest; a flow the share cannot pay for is refused
//     ([ReasonLimit]), as is one past [Options.MaxConns] (256). The part
//     of a share above its floor (4 MiB) also counts against the daemon's
//     budget (1 GiB), so the floor is what a sandbox can always open
//     whatever the others hold.
//   - DNS over TCP: at most 16 connections, 16 KiB buffers each, one query
//     resolved at a time per connection, 10 s idle and 5 s write
//     deadlines: a client that pipelines queries and never reads its
//     answers is cut off. At most 64 queries are resolved at once, at
//     most [Options.DNSRate] (100/s) answered; UDP queries over the rate
//     are dropped, TCP ones wait. Answers from upstream are kept in one
//     cache shared by all sandboxes ([dns.Cache]); each sandbox's resolver
//     still filters them and records what it handed out.
//   - The link reads at most [Options.PacketRate] (10,000) packets per
//     second from the TUN device: past it, the stack waits before reading
//     and the sandbox's excess packets wait or are dropped in its own
//     kernel. Every TCP segment with data the stack sends the sandbox earns
//     it one packet past the rate (at most 1,024 banked): the
//     acknowledgement it calls for, so that a download is not bounded by
//     the rate. Packets are handled on the reading goroutine, never
//     queued.
//   - A SYN the policy refuses is answered (RST) on the packet's own
//     goroutine without any state, within [Options.RefusedRate] (50/s,
//     each with an event); past it the SYN is dropped and counted, and the
//     count goes out with the sandbox's next event ([FlowEvent.Suppressed]).
//     Allowed SYNs reach the forwarder (which starts a goroutine and dials
//     upstream) at most [Options.NewFlowRate] (200/s) times per second.
//   - Ingress connections ([Stack.DialSandbox]) are made by the daemon's
//     API callers, not the sandbox: at most [Options.MaxIngress] (64) at
//     once, with the stack's usual buffers.
//
// So one sandbox costs the daemon at most about 70 MiB of memory (its 64
// MiB share, 16 DNS connections ≈ 2 MiB, 256 handshakes being decided ≈
// 3 MiB, the stack itself ≈ 1 MiB), plus up to 42 MiB for ingress
// connections its API callers hold, and all sandboxes together at most
// the budget plus each one's floor and fixed part. Its packet work is at
// most PacketRate packets a second, about 10–20 µs each on a 2-vCPU
// virtual machine (0.1–0.2 of a core), plus one packet per data segment
// the stack chose to send it; bulk data through allowed flows costs in
// proportion to its bytes, bounded by the same packet rate for uploads
// (64 KiB a packet) and by [Options.Bandwidth] when set. Counters of what was
// refused, limited and charged are in [Shared.Stats].
//
// With [Options.Ask] set (network approval "ask"), a lookup of a name the
// policy does not allow for want of an allow rule waits for Ask's
// [Approval]; at most 32 lookups wait at once, more are refused at once. A
// name approved once is allowed, as an exact name, for [OnceGrant] on top of
// whatever policy is set meanwhile; one approved for the sandbox is in the
// policy Ask set. Connections to an address only ever reach the flow
// decision with the names the resolver handed out for it, so approval never
// opens a raw address.
//
// # What it does not do
//
// It does not create the TUN device or configure the sandbox side (see
// [Options.FD] and the backend). It does not intercept TLS: after the
// first ClientHello a TLS stream is opaque, and so it cannot
// tell apart two names served from the same address with the same
// certificate (HTTP/2 coalescing, domain fronting): those are accepted
// risks for allowed names. IPv4 and IPv6 fragments are dropped. Policy changes
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
