package egress

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/fencesandbox/fence/internal/egress/policy"
)

// gateSYN wraps the TCP forwarder's packet handler with the cheap part of
// the flow decision, made on the packet's own goroutine before the
// forwarder creates any state or goroutine for the attempt:
//
//   - an attempt the policy refuses gets a RST from the stack (the handler
//     reports the packet unhandled) and an event, within the sandbox's
//     refused rate; over it, the SYN is dropped and only counted;
//   - an attempt the policy allows goes to the forwarder within the
//     sandbox's new-flow rate; over it, the SYN is dropped and the sandbox
//     retransmits it.
//
// Packets other than a SYN go to the forwarder unchanged.
func (st *Stack) gateSYN(next func(stack.TransportEndpointID, *stack.PacketBuffer) bool) func(stack.TransportEndpointID, *stack.PacketBuffer) bool {
	stats := &st.opts.Shared.stats
	return func(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
		h := header.TCP(pkt.TransportHeader().Slice())
		if len(h) < header.TCPMinimumSize {
			return next(id, pkt)
		}
		if f := h.Flags(); !f.Contains(header.TCPFlagSyn) || f.Contains(header.TCPFlagAck) {
			return next(id, pkt)
		}
		src, dst := flowAddrs(id)
		reason, rule, name := ReasonHostAddr, "", ""
		allowed := false
		if !st.hostAddr[dst.Addr().Unmap()] {
			d := st.policy.Load().Decide(policy.Flow{Proto: policy.TCP, Dst: dst, Names: st.resolver.NamesFor(dst.Addr())})
			allowed, reason, rule, name = d.Allow, d.Reason, d.Rule, d.Name
		}
		if allowed {
			if st.newFlows.Allow() {
				return next(id, pkt)
			}
			stats.synLimited.Add(1)
			return true // dropped: the sandbox retransmits
		}
		if !st.refused.Allow() {
			stats.synLimited.Add(1)
			st.suppressed.Add(1)
			return true
		}
		stats.refused.Add(1)
		st.record(FlowEvent{Proto: "tcp", Src: src, Dst: dst, Name: name, Reason: reason, Rule: rule,
			Start: time.Now(), Suppressed: st.suppressed.Swap(0)})
		return false // unhandled: the stack answers with RST
	}
}

// flushSuppressed records one event for refused attempts dropped without
// an event of their own, if there are any.
func (st *Stack) flushSuppressed() {
	if n := st.suppressed.Swap(0); n > 0 {
		st.record(FlowEvent{Proto: "tcp", Reason: ReasonRateLimit, Start: time.Now(), Suppressed: n})
	}
}
