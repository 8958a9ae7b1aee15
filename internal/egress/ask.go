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
	st.grantMu.Lock()
	if st.grants == nil {
		st.grants = map[string]time.Time{}
	}
	if _, ok := st.grants[name]; !ok && len(st.grants) >= maxGrants {
		oldest := ""
		for n, t := range st.grants {
			if oldest == "" || t.Before(st.grants[oldest]) {
				oldest = n
			}
		}
		delete(st.grants, oldest)
	}
	st.grants[name] = time.Now().Add(OnceGrant)
	st.applyLocked()
	st.grantMu.Unlock()
	time.AfterFunc(OnceGrant, st.expireGrants)
}

func (st *Stack) expireGrants() {
	st.grantMu.Lock()
	defer st.grantMu.Unlock()
	now := time.Now()
	maps.DeleteFunc(st.grants, func(_ string, t time.Time) bool { return !now.Before(t) })
	st.applyLocked()
}

// applyLocked makes the policy in force the base policy with the names
// granted once.
//
// +checklocks:st.grantMu
func (st *Stack) applyLocked() {
	p := st.base
	if len(st.grants) > 0 {
		p = p.WithNames(slices.Sorted(maps.Keys(st.grants)))
	}
	st.policy.Store(p)
	st.resolver.SetPolicy(p)
}

// Granted returns the names approved once and not yet expired.
func (st *Stack) Granted() []string {
	st.grantMu.Lock()
	defer st.grantMu.Unlock()
	return slices.Sorted(maps.Keys(st.grants))
}
