package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/tbuild"
	"github.com/fencesandbox/fence/internal/tenancy"
)

var _ httpapi.Templates = (*tbuild.Runner)(nil)

// templateSet is the template catalog (built templates, then fence's
// own) as sandbox creation asks for it.
type templateSet struct{ tbuild.Catalog }

var (
	_ sandbox.Templates   = templateSet{}
	_ sandbox.Identifier  = templateSet{}
	_ sandbox.ReadyPorter = templateSet{}
	_ sandbox.Runtimer    = templateSet{}
	_ sandbox.ResolverFor = templateSet{}
	_ sandbox.Fetcher     = templateSet{}
)

func (t templateSet) Runtime(name string) (sandbox.Runtime, bool) {
	l, ok := t.Launch(name)
	return sandbox.Runtime{DefaultUser: l.User, DefaultWorkdir: l.Workdir, Env: l.Env, StartCmd: l.StartCmd, ReadyCmd: l.ReadyCmd,
		CPUs: l.CPUs, MemoryMB: l.MemoryMB}, ok
}

// buildSandboxes is the sandbox manager as the template builds see it:
// they create their build sandboxes through it and ask which sandboxes
// live (a deleted template's trees wait for its last sandbox).
type buildSandboxes struct {
	m *sandbox.Manager
	q *tenancy.Quotas // the teams' limits of builds in progress
}

var (
	_ tbuild.Sandboxes     = buildSandboxes{}
	_ tbuild.BuildAdmitter = buildSandboxes{}
)

// AdmitBuild takes room for one more build of the team ctx acts for (the
// default team, for none).
func (b buildSandboxes) AdmitBuild(ctx context.Context) (func(), error) {
	team := tenancy.DefaultTeamID
	if p, ok := tenancy.FromContext(ctx); ok {
		team = p.Team
	}
	return b.q.AdmitBuild(team)
}

func (b buildSandboxes) CreateBox(ctx context.Context, s tbuild.BoxSpec) (string, isolation.Sandbox, error) {
	allow := s.AllowInternet
	sb, err := b.m.Create(ctx, sandbox.CreateRequest{
		TemplateID:          s.Template,
		Timeout:             s.Timeout,
		Metadata:            map[string]string{sandbox.BuildMetadataKey: s.BuildID, sandbox.BackendMetadataKey: s.Backend},
		CPUs:                s.CPUs,
		MemoryMB:            s.MemoryMB,
		AllowInternetAccess: &allow,
		Network:             s.Network,
		IdleTimeout:         new(time.Duration), // its steps reach the agent directly: never idle-paused
	})
	if err != nil {
		return "", nil, err
	}
	info, box, err := b.m.Live(sb.ID)
	if err != nil || info.State != sandbox.StateRunning {
		_ = b.m.Kill(context.WithoutCancel(ctx), sb.ID)
		return "", nil, fmt.Errorf("build sandbox %s is gone: %w", sb.ID, api.ErrNotFound)
	}
	return sb.ID, box, nil
}

func (b buildSandboxes) Kill(ctx context.Context, id string) error { return b.m.Kill(ctx, id) }

func (b buildSandboxes) Live(ctx context.Context) ([]tbuild.LiveSandbox, error) {
	all, err := b.m.List(ctx, sandbox.ListFilter{})
	if err != nil {
		return nil, err
	}
	live := make([]tbuild.LiveSandbox, 0, len(all))
	for _, sb := range all {
		live = append(live, tbuild.LiveSandbox{Template: sb.TemplateID, Paused: sb.State == sandbox.StatePaused})
	}
	return live, nil
}

func (b buildSandboxes) CreatesInFlight() int { return b.m.CreatesInFlight() }
