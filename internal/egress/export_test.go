package egress

// Exported for tests.
const (
	FullFlowCost  = fullFlowCost
	SmallFlowCost = smallFlowCost
	MaxDNSConns   = maxDNSConns
	MaxPaceCredit = maxPaceCredit
)

// SYNsInline is how many SYNs (SYN-ACKs to the sandbox) st's send queue
// wrote on their sender's goroutine, deliveries held.
func SYNsInline(st *Stack) int64 { return st.sendQ.synInline.Load() }
