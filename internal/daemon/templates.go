package daemon

import (
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

func (t templateSet) Runtime(name string) (sandbox.Runtime, bool) {
	rt, ok := t.built.Runtime(name)
	if !ok {
		return sandbox.Runtime{}, false
	}
	return sandbox.Runtime{DefaultUser: rt.User, DefaultWorkdir: rt.Workdir, StartCmd: rt.StartCmd, ReadyCmd: rt.ReadyCmd,
		CPUs: float64(rt.CPUs), MemoryMB: int64(rt.MemoryMB)}, true
}
