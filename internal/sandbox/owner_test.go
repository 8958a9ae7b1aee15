package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestOwnedByTeam checks that a sandbox belongs to the team that created
// it, and that every operation of another team answers exactly as for a
// missing sandbox and changes nothing.
func TestOwnedByTeam(t *testing.T) {
	e := newEnv(t)
	a := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-a", KeyID: "ka"})
	b := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-b", KeyID: "kb"})
	s, err := e.m.Create(a, CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Team != "team-a" {
		t.Fatalf("Team = %q, want team-a", s.Team)
	}
	_, missing := e.m.Get(b, "nosuchsandbox0000000")
	same := func(op string, err error) {
		t.Helper()
		want := notFound(s.ID).Error()
		if !errors.Is(err, api.ErrNotFound) || err.Error() != want {
			t.Errorf("%s(other team's) = %v, want %q (as for a missing one: %v)", op, err, want, missing)
		}
	}
	_, err = e.m.Get(b, s.ID)
	same("Get", err)
	same("Owned", e.m.Owned(b, s.ID))
	same("SetTimeout", e.m.SetTimeout(b, s.ID, time.Hour))
	same("Pause", e.m.Pauses().Pause(b, s.ID, WithMemory))
	_, err = e.m.Pauses().Resume(b, s.ID, time.Minute, nil, WithMemory)
	same("Resume", err)
	_, _, err = e.m.Pauses().Connect(b, s.ID, time.Minute, WithMemory)
	same("Connect", err)
	same("Kill", e.m.Kill(b, s.ID))
	if l, err := e.m.List(b, ListFilter{}); err != nil || len(l) != 0 {
		t.Errorf("List(team-b) = %d sandboxes, %v; want none", len(l), err)
	}

	got, err := e.m.Get(a, s.ID)
	if err != nil || got.State != StateRunning || !got.EndAt.Equal(s.EndAt) {
		t.Fatalf("Get(own) after the other team's attempts = %+v, %v; want it unchanged", got, err)
	}
	if l, err := e.m.List(a, ListFilter{}); err != nil || len(l) != 1 || l[0].Team != "team-a" {
		t.Errorf("List(team-a) = %v, %v", l, err)
	}
	if err := e.m.Owned(a, s.ID); err != nil {
		t.Errorf("Owned(own) = %v", err)
	}
	if err := e.m.Kill(a, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Owned(a, s.ID); err != nil {
		t.Errorf("Owned(own, killed) = %v: a killed sandbox's record is still the team's", err)
	}
	same("Owned(killed)", e.m.Owned(b, s.ID))
	if err := e.m.Owned(t.Context(), s.ID); err != nil {
		t.Errorf("Owned(daemon) = %v", err)
	}
}

// TestTeamsCountsAndKills: the admin's view counts each team's running
// sandboxes, and kills one team's alone.
func TestTeamsCountsAndKills(t *testing.T) {
	e := newEnv(t)
	ctxOf := func(team string) context.Context {
		return tenancy.NewContext(t.Context(), tenancy.Principal{Team: team, KeyID: "k"})
	}
	for _, team := range []string{"team-a", "team-a", "team-b"} {
		if _, err := e.m.Create(ctxOf(team), CreateRequest{TemplateID: "base"}); err != nil {
			t.Fatal(err)
		}
	}
	admin := tenancy.NewContext(t.Context(), tenancy.Principal{Team: tenancy.DefaultTeamID, KeyID: tenancy.BootstrapKeyID, Admin: true})
	got, err := TeamsOf(e.m).RunningCounts(admin)
	if err != nil || got["team-a"] != 2 || got["team-b"] != 1 || len(got) != 2 {
		t.Fatalf("RunningCounts = %v, %v; want team-a 2, team-b 1", got, err)
	}
	if k, f, err := TeamsOf(e.m).KillTeam(admin, "team-a"); k != 2 || f != 0 || err != nil {
		t.Fatalf("KillTeam(team-a) = %d, %d, %v", k, f, err)
	}
	if l, _ := e.m.List(ctxOf("team-b"), ListFilter{}); len(l) != 1 {
		t.Errorf("team-b has %d sandboxes after team-a's were killed, want 1", len(l))
	}
	if l, _ := e.m.List(ctxOf("team-a"), ListFilter{}); len(l) != 0 {
		t.Errorf("team-a has %d sandboxes after KillTeam, want 0", len(l))
	}
}
