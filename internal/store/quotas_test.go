package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestTeamRecords covers the team-wide records the quotas and approvals
// keep: egress bytes per day (added up, per day), names approved for a
// team (kept once), a credential's role, and a team's cap of secrets
// under concurrent inserts (exactly the cap kept, the others refused as
// exhausted, another team unaffected).
func TestTeamRecords(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	team, err := s.CreateTeam(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{100, 250} {
		if err := s.AddTeamEgress(ctx, team.ID, 20000, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddTeamEgress(ctx, team.ID, 20001, 7); err != nil {
		t.Fatal(err)
	}
	if got, err := s.TeamEgress(ctx, 20000); err != nil || got[team.ID] != 350 || len(got) != 1 {
		t.Errorf("TeamEgress(day 20000) = %v, %v; want %s: 350", got, err, team.ID)
	}

	for range 2 {
		if err := s.AddTeamName(ctx, team.ID, "api.example.com", "key:k1"); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.TeamNames(ctx); err != nil || len(got[team.ID]) != 1 || got[team.ID][0] != "api.example.com" {
		t.Errorf("TeamNames = %v, %v", got, err)
	}

	value, c, err := s.MintRole(ctx, team.ID, KindAPIKey, "audit", "test", tenancy.RoleAuditor)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Authenticate(ctx, KindAPIKey, value); err != nil || got.ID != c.ID || got.Role != tenancy.RoleAuditor {
		t.Errorf("Authenticate(auditor key) = %+v, %v", got, err)
	}
	if _, _, err := s.MintRole(ctx, team.ID, KindAPIKey, "x", "test", "owner"); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("MintRole(unknown role) = %v, want ErrInvalidArgument", err)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, exhausted := 0, 0
	for i := range 12 {
		wg.Go(func() {
			err := s.InsertTeamSecret(ctx, &Secret{ID: fmt.Sprint("sec_t", i), Name: fmt.Sprint("t", i), Version: 1,
				Team: team.ID, Sealed: []byte{1}, CreatedAt: time.Now(), UpdatedAt: time.Now()}, 0, 3)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, api.ErrResourceExhausted):
				exhausted++
			default:
				t.Errorf("InsertTeamSecret = %v", err)
			}
		})
	}
	wg.Wait()
	if n, err := s.CountTeamSecrets(ctx, team.ID); err != nil || n != 3 || ok != 3 || exhausted != 9 {
		t.Errorf("team secrets: %d kept (%v), %d ok, %d exhausted; want 3, 3, 9", n, err, ok, exhausted)
	}
	if err := s.InsertTeamSecret(ctx, &Secret{ID: "sec_other", Name: "other", Version: 1,
		Team: tenancy.DefaultTeamID, Sealed: []byte{1}, CreatedAt: time.Now(), UpdatedAt: time.Now()}, 0, 3); err != nil {
		t.Errorf("another team's secret under its own cap = %v", err)
	}
}
