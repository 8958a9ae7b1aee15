package sandbox

import (
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
