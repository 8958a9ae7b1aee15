package fences

import (
	"context"
	"sync"
)

// TeamNames keeps the names approved for a whole team (the "team"
// decision on an approval request); *store.Store implements it.
type TeamNames interface {
	AddTeamName(ctx context.Context, team, name, decidedBy string) error
	TeamNames(ctx context.Context) (map[string][]string, error)
}

// teamNames are the names each team's sandboxes that ask reach without
// asking: loaded from the store on first use, added to by AllowTeamName.
type teamNames struct {
	store TeamNames // nil: kept in memory only
	load  sync.Once
	mu    sync.Mutex
	// +checklocks:mu
	byTeam map[string]map[string]bool
}

func (t *teamNames) loaded(ctx context.Context, s *Set) {
	t.load.Do(func() {
		if t.store == nil {
			return
		}
		all, err := t.store.TeamNames(ctx)
		if err != nil {
			s.log.WarnContext(ctx, "loading the names approved for teams", "err", err)
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		for team, names := range all {
			for _, n := range names {
				t.addLocked(team, n)
			}
		}
	})
}

// +checklocks:t.mu
func (t *teamNames) addLocked(team, name string) {
	if t.byTeam == nil {
		t.byTeam = map[string]map[string]bool{}
	}
	if t.byTeam[team] == nil {
		t.byTeam[team] = map[string]bool{}
	}
	t.byTeam[team][name] = true
}

// allowed reports whether name is approved for team.
func (s *Set) teamAllowed(ctx context.Context, team, name string) bool {
	s.teamNames.loaded(ctx, s)
	s.teamNames.mu.Lock()
	defer s.teamNames.mu.Unlock()
	return team != "" && s.teamNames.byTeam[team][name]
}

// AllowTeamName approves name for every sandbox of team (the "team"
// decision on sandbox id's approval request, by decidedBy): it is kept
// (in the store first), added to sandbox id's allowlist at once, and to
// each other sandbox of team whose network asks at its first lookup of
// the name, which then asks no one. Other teams' sandboxes are not
// touched.
func (s *Set) AllowTeamName(ctx context.Context, team, id, name, decidedBy string) error {
	s.teamNames.loaded(ctx, s)
	if st := s.teamNames.store; st != nil {
		if err := st.AddTeamName(ctx, team, name, decidedBy); err != nil {
			return err
		}
	}
	s.teamNames.mu.Lock()
	s.teamNames.addLocked(team, name)
	s.teamNames.mu.Unlock()
	return s.AllowName(ctx, id, name)
}
