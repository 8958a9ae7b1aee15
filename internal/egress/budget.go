package egress

import (
	"net"

	"gvisor.dev/gvisor/pkg/tcpip"

	"github.com/fencesandbox/fence/internal/egress/policy"
)

// ReasonEgressSpent refuses a flow because the sandbox's team has spent
// its egress bytes of the day (Options.Admit).
const ReasonEgressSpent = "egress-quota-spent"

// refusal tells whether a new TCP flow the policy decided d is refused,
// with the reason and rule it is recorded with: the policy's refusal,
// else Options.Admit's.
func (st *Stack) refusal(d policy.Decision) (refused bool, reason, rule string) {
	if !d.Allow {
		return true, d.Reason, d.Rule
	}
	if reason := st.admit(); reason != "" {
		return true, reason, ""
	}
	return false, "", ""
}

// admit returns Options.Admit's reason to refuse a flow ("": none).
func (st *Stack) admit() string {
	if st.opts.Admit == nil {
		return ""
	}
	return st.opts.Admit()
}

// trackFlow tracks the sandbox's side of an egress flow (c, on endpoint
// ep): Close closes it, EndFlows resets it.
func (st *Stack) trackFlow(c net.Conn, ep tcpip.Endpoint) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	st.conns[c] = struct{}{}
	if st.flows == nil {
		st.flows = map[net.Conn]tcpip.Endpoint{}
	}
	st.flows[c] = ep
	return true
}

// EndFlows resets the sandbox's egress TCP flows open now (each is
// recorded with the bytes it moved, as any ended flow), whatever data
// they still hold. Connections to the sandbox (DialSandbox) and its DNS
// are left alone. A flow admitted before and tracked after it (its
// upstream was being dialled) is not among them: Options.Admit, asked
// again once the flow is tracked, is to refuse it from before EndFlows
// is called.
func (st *Stack) EndFlows() {
	st.mu.Lock()
	flows := make(map[net.Conn]tcpip.Endpoint, len(st.flows))
	for c, ep := range st.flows {
		flows[c] = ep
	}
	st.mu.Unlock()
	for c, ep := range flows {
		abort(ep)
		c.Close()
	}
}
