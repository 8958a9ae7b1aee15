package egress

import (
	"net"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// ReasonEgressSpent refuses a flow because the sandbox's team has spent
// its egress bytes of the day (Options.Admit).
const ReasonEgressSpent = "egress-quota-spent"

// admit asks Options.Admit about a new TCP flow: the reason it is
// refused for, "" to let it through.
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
// are left alone.
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
