package httpapi

import (
	"testing"

	"github.com/fencesandbox/fence/internal/capacity"
)

// TestProxyIdleConnsFitTheMargin: the descriptors the agent and port
// proxies may keep idle, with room for the requests in flight, fit in what
// admission leaves free of the daemon's descriptors: a node that refuses
// creates at its RLIMIT_NOFILE still runs a command in every sandbox.
func TestProxyIdleConnsFitTheMargin(t *testing.T) {
	const inFlight = 256 // connections of requests in flight (client and proxy sides)
	if need, margin := int64(2*maxIdleConns+inFlight), capacity.SafetyMargin[capacity.DaemonFiles]; need > margin {
		t.Errorf("the proxies keep up to %d idle connections (%d with requests in flight), admission leaves %d descriptors free",
			2*maxIdleConns, need, margin)
	}
}
