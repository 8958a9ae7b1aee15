package daemon

import (
	"strings"

	"github.com/fencesandbox/fence/internal/httpapi"
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
