package egress

import (
	"context"
	"maps"
	"slices"
	"time"
)

// Approval answers Options.Ask.
type Approval int

// Approvals.
const (
	Refused     Approval = iota // the lookup is refused (NXDOMAIN)
	AllowOnce                   // the name is allowed for OnceGrant, the policy unchanged
	AllowPolicy                 // the policy now allows the name (SetPolicy was called)
)

const (
	// OnceGrant is how long a name approved once stays reachable: long
	// enough for the held connection to be made, no longer.
	OnceGrant = 30 * time.Second
	// maxGrants bounds one sandbox's names approved once and not yet
	// expired; the oldest goes first.
	maxGrants = 16
	// maxHeld bounds lookups held for an approval at once, under the
	// resolver's in-flight bound, so a sandbox's held lookups leave it
	// a resolver for allowed names.
	maxHeld = maxDNSInFlight / 2
)

// ask answers the resolver's Config.Ask: it holds the lookup while
// Options.Ask decides, and grants a name approved once.
func (st *Stack) ask(ctx context.Context, name string) bool {
	if st.opts.Ask == nil {
		return false
	}
	if st.held.Add(1) > maxHeld {
		st.held.Add(-1)
		return false
	}
	defer st.held.Add(-1)
	switch st.opts.Ask(ctx, name) {
	case AllowOnce:
		st.grant(name)
		return true
	case AllowPolicy:
		return true
	}
	return false
}

// grant makes name reachable for OnceGrant.
func (st *Stack) grant(name string) {
	st.grants.mu.Lock()
	if st.grants.byName == nil {
		st.grants.byName = map[string]time.Time{}
	}
	if _, ok := st.grants.byName[name]; !ok && len(st.grants.byName) >= maxGrants {
		oldest := ""
		for n, t := range st.grants.byName {
			if oldest == "" || t.Before(st.grants.byName[oldest]) {
				oldest = n
			}
		}
		delete(st.grants.byName, oldest)
	}
	st.grants.byName[name] = time.Now().Add(OnceGrant)
	st.applyLocked()
	st.grants.mu.Unlock()
	time.AfterFunc(OnceGrant, st.expireGrants)
}

func (st *Stack) expireGrants() {
	st.grants.mu.Lock()
	defer st.grants.mu.Unlock()
	now := time.Now()
	maps.DeleteFunc(st.grants.byName, func(_ string, t time.Time) bool { return !now.Before(t) })
	st.applyLocked()
}

// applyLocked makes the policy in force the base policy with the names
// granted once.
//
// +checklocks:st.grants.mu
func (st *Stack) applyLocked() {
	p := st.grants.base
	if len(st.grants.byName) > 0 {
		p = p.WithNames(slices.Sorted(maps.Keys(st.grants.byName)))
	}
	st.policy.Store(p)
	st.resolver.SetPolicy(p)
}

// Granted returns the names approved once and not yet expired.
func (st *Stack) Granted() []string {
	st.grants.mu.Lock()
	defer st.grants.mu.Unlock()
	return slices.Sorted(maps.Keys(st.grants.byName))
}
