package egress

// Exported for tests.
const (
	FullFlowCost  = fullFlowCost
	SmallFlowCost = smallFlowCost
	MaxDNSConns   = maxDNSConns
	MaxPaceCredit = maxPaceCredit
)
