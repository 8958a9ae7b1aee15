package daemon

import (
	"context"
	"fmt"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/tbuild"
	"github.com/fencesandbox/fence/internal/template"
)

var _ httpapi.Templates = (*tbuild.Service)(nil)

// templateSet is what sandbox creation resolves template names with:
// built templates (name[:tag] or ID, and the layers of builds in
// progress) first, then fence's own templates.
type templateSet struct {
	own   *template.Store
	built *tbuild.Service
}

func (t templateSet) Resolve(name string) (string, error) {
	if p, ok, err := t.built.Resolve(name); ok {
		return p, err
	}
	return t.own.Resolve(name)
}

func (t templateSet) ReadyPorts(name string) []uint16 { return t.own.ReadyPorts(name) }

// Identity gives a built template's ID and alias; fence's own templates
// are their name, which is both.
func (t templateSet) Identity(name string) (id, alias string, ok bool) {
	if id, alias, ok := t.built.Identity(name); ok {
		return id, alias, true
	}
	if _, err := t.own.Resolve(name); err == nil {
		return name, name, true
	}
	return "", "", false
}

func (t templateSet) Runtime(name string) (sandbox.Runtime, bool) {
	rt, ok := t.built.Runtime(name)
	if !ok {
		return t.ownRuntime(name)
	}
	return sandbox.Runtime{DefaultUser: rt.User, DefaultWorkdir: rt.Workdir, StartCmd: rt.StartCmd, ReadyCmd: rt.ReadyCmd,
		CPUs: float64(rt.CPUs), MemoryMB: int64(rt.MemoryMB)}, true
}

// ownRuntime gives a template built from a container image its image's
// environment, working directory and user (when the user is a name; a
// numeric uid is left to the template's default user).
func (t templateSet) ownRuntime(name string) (sandbox.Runtime, bool) {
	info, err := t.own.Info(name)
	if err != nil || (len(info.Env) == 0 && info.WorkDir == "" && info.User == "") {
		return sandbox.Runtime{}, false
	}
	rt := sandbox.Runtime{DefaultWorkdir: info.WorkDir}
	if u, _, _ := strings.Cut(info.User, ":"); u != "" && strings.Trim(u, "0123456789") != "" {
		rt.DefaultUser = u
	}
	for _, kv := range info.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			if rt.Env == nil {
				rt.Env = map[string]string{}
			}
			rt.Env[k] = v
		}
	}
	return rt, true
}

// buildSandboxes is the sandbox manager as the template builds see it:
// they create their build sandboxes through it and ask which sandboxes
// live (a deleted template's trees wait for its last sandbox).
type buildSandboxes struct{ m *sandbox.Manager }

var _ tbuild.Sandboxes = buildSandboxes{}

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
	})
	if err != nil {
		return "", nil, err
	}
	box, _, ok := b.m.Lookup(sb.ID)
	if !ok {
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
