package sandbox

import (
	"context"
	"errors"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Teams counts and kills the Manager's sandboxes by team, for the admin
// routes; it acts for no principal of its own (every team's sandboxes
// are its to see).
type Teams struct{ m *Manager }

// TeamsOf returns m's sandboxes by team.
func TeamsOf(m *Manager) Teams { return Teams{m} }

// RunningCounts returns the number of running sandboxes of each team that
// has any.
func (t Teams) RunningCounts(ctx context.Context) (map[string]int, error) {
	all, err := t.m.List(tenancy.NewContext(ctx, tenancy.Principal{}), ListFilter{States: []State{StateRunning}})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, s := range all {
		out[tenancy.Owner(s.Team)]++
	}
	return out, nil
}

// KillTeam kills every running sandbox of team and says how many it
// killed and how many it failed to (one killed meanwhile counts as
// neither).
func (t Teams) KillTeam(ctx context.Context, team string) (killed, failed int, err error) {
	ctx = tenancy.NewContext(ctx, tenancy.Principal{Team: team})
	all, err := t.m.List(ctx, ListFilter{States: []State{StateRunning}})
	if err != nil {
		return 0, 0, err
	}
	for _, s := range all {
		switch err := t.m.Kill(ctx, s.ID); {
		case err == nil:
			killed++
		case !errors.Is(err, api.ErrNotFound):
			failed++
		}
	}
	return killed, failed, nil
}
