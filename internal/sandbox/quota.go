package sandbox

import (
	"context"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// The team quota (Options.Quota) is asked before a create or a fork is
// admitted (with the team of the request's principal), before a pause
// (the paused limit) and before a resume (the running limits); it is told
// of each sandbox registered, taken over from a previous daemon or
// removed. Its checks and counts are its own (tenancy.Quotas), so that
// concurrent creates of a team never overshoot its limits.

// teamOf is the team a create acts for: its principal's, else the
// default team (work the daemon does on its own).
func teamOf(ctx context.Context) string {
	if p, ok := tenancy.FromContext(ctx); ok {
		return p.Team
	}
	return tenancy.DefaultTeamID
}

// recordTeam is the team of a sandbox taken over from a previous daemon:
// its record's, or the default team for a record made before teams.
func recordTeam(s *Sandbox) string {
	if s.Team != "" {
		return s.Team
	}
	return tenancy.DefaultTeamID
}

// quotaSize is what a sandbox takes of its team's quota.
func quotaSize(s *Sandbox) tenancy.Size {
	return tenancy.Size{CPUs: s.CPUs, MemoryMB: s.MemoryMB, DiskMB: s.DiskMB}
}

// admitTeam takes room in the team's quota for the create c planned.
// A template build's sandboxes are the daemon's, not a team's: builds
// are limited apart (the API refuses BuildMetadataKey in a create).
func (c *creating) admitTeam(ctx context.Context) error {
	if _, ok := c.req.Metadata[BuildMetadataKey]; ok {
		return nil
	}
	size := tenancy.Size{CPUs: c.limits.CPUs, MemoryMB: c.limits.MemoryBytes >> 20,
		DiskMB: c.limits.DiskBytes >> 20, Timeout: c.timeout}
	h, err := c.m.quota.Admit(teamOf(ctx), size)
	if err != nil {
		return err
	}
	c.hold = h
	return nil
}

// noQuota admits everything.
func noQuota() tenancy.Admission {
	q, _ := tenancy.NewQuotas(nil, tenancy.Limits{})
	return q
}
