package cli

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/fencesandbox/fence/internal/tenancy"
)

// addTeamLimitFlags binds `fence serve`'s daemon-wide defaults of the
// teams' limits (a team's own, set through PUT /teams/{teamID}/limits,
// replace them) to the fields of l. Zero limits nothing.
func addTeamLimitFlags(fs *pflag.FlagSet, l *tenancy.Limits) {
	fs.IntVar(&l.ConcurrentSandboxes, "team-max-sandboxes", 0, "running sandboxes each team may have at once, paused ones apart (0: no limit)")
	fs.IntVar(&l.PausedSandboxes, "team-max-paused", 0, "paused sandboxes each team may keep (0: no limit)")
	fs.Float64Var(&l.VCPUs, "team-vcpus", 0, "vCPUs each team's running sandboxes may have in all (0: no limit)")
	fs.Int64Var(&l.MemoryMB, "team-memory-mb", 0, "memory in MiB each team's running sandboxes may have in all (0: no limit)")
	fs.Int64Var(&l.DiskMB, "team-disk-mb", 0, "writable disk in MiB a team's sandbox may ask for (0: no limit)")
	fs.IntVar(&l.ConcurrentBuilds, "team-max-builds", 0, "template builds each team may run at once (0: no limit)")
	fs.Var(&secondsValue{p: &l.MaxLifetimeSeconds}, "team-max-lifetime", "longest timeout a team's sandbox may be created with, e.g. 1h (0: no limit)")
	fs.Float64Var(&l.RequestsPerSecond, "team-rate", 0, "API requests per second each key may make; over it the API answers 429 with Retry-After (0: no limit)")
	fs.IntVar(&l.Burst, "team-burst", 0, "API requests each key may make at once under --team-rate (default: one second of them)")
	fs.IntVar(&l.Snapshots, "team-max-snapshots", 0, "persistent snapshots each team may keep (0: no limit)")
	fs.Int64Var(&l.SnapshotBytes, "team-snapshot-bytes", 0, "bytes each team's snapshots may take on disk in all (0: no limit)")
	fs.IntVar(&l.Secrets, "team-max-secrets", 0, "secrets each team may keep (0: no limit)")
	fs.Int64Var(&l.EgressBytesPerDay, "team-egress-bytes-per-day", 0, "bytes each team's sandboxes may send and receive through the egress fence per UTC day (0: no limit)")
}

// checkTeamLimits refuses negative team limits.
func checkTeamLimits(l tenancy.Limits) error {
	if err := l.Validate(); err != nil {
		return usagef("--team-*: %v", err)
	}
	return nil
}

// secondsValue is a duration flag kept in whole seconds.
type secondsValue struct{ p *int64 }

func (v *secondsValue) String() string {
	if v.p == nil || *v.p == 0 {
		return "0s"
	}
	return (time.Duration(*v.p) * time.Second).String()
}

func (v *secondsValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d%time.Second != 0 {
		return fmt.Errorf("want a duration of whole seconds such as 90s or 2h")
	}
	*v.p = int64(d / time.Second)
	return nil
}

func (v *secondsValue) Type() string { return "duration" }
