package cli

import (
	"context"
	"testing"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func TestServeTeamLimits(t *testing.T) {
	var got fencedaemon.Config
	deps := Deps{Serve: func(ctx context.Context, o fencedaemon.Config) error { got = o; return nil }}
	t.Setenv("FENCE_API_KEY", "e2b_abc")
	code, _, stderr := execute(t, deps, "", "serve", "--team-max-sandboxes", "10", "--team-max-paused", "3", "--team-vcpus", "4.5",
		"--team-memory-mb", "2048", "--team-disk-mb", "512", "--team-max-lifetime", "1h", "--team-rate", "2.5", "--team-burst", "5", "--team-max-builds", "2")
	want := tenancy.Limits{ConcurrentSandboxes: 10, PausedSandboxes: 3, VCPUs: 4.5, MemoryMB: 2048, DiskMB: 512,
		MaxLifetimeSeconds: 3600, RequestsPerSecond: 2.5, Burst: 5, ConcurrentBuilds: 2}
	if code != 0 || got.TeamLimits != want {
		t.Fatalf("fence serve --team-* = %d %s, %+v; want %+v", code, stderr, got.TeamLimits, want)
	}
	for _, bad := range [][]string{{"--team-max-sandboxes", "-1"}, {"--team-rate", "-1"}, {"--team-max-lifetime", "-1h"}, {"--team-max-lifetime", "1.5s"}} {
		if code, _, _ := execute(t, deps, "", append([]string{"serve"}, bad...)...); code != 2 {
			t.Errorf("fence serve %v = %d, want 2 (usage)", bad, code)
		}
	}
}
