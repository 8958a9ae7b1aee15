package store

import (
	"testing"

	"github.com/fencesandbox/fence/internal/tenancy"
)

func TestTeamLimitsPersist(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()
	if got, err := s.TeamLimits(ctx); err != nil || len(got) != 0 {
		t.Fatalf("TeamLimits of a new store = %v, %v", got, err)
	}
	l := tenancy.Limits{ConcurrentSandboxes: 10, VCPUs: 2.5, RequestsPerSecond: 1}
	if err := s.SetTeamLimits(ctx, "t1", tenancy.Limits{ConcurrentSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTeamLimits(ctx, "t1", l); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = reopen(t, path)
	defer s.Close()
	got, err := s.TeamLimits(ctx)
	if err != nil || len(got) != 1 || got["t1"] != l {
		t.Fatalf("after reopening: %v, %v", got, err)
	}
}
