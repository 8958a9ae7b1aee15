package tbuild

import (
	"strings"
)

// Catalog is every template a sandbox create may name, as sandbox creation
// asks for it: built templates (name[:tag] or ID, and the layers of build
// sandboxes) first, then fence's own (Options.Parents). The daemon hands
// it to the sandbox manager.
type Catalog struct{ s *Service }

// Catalog returns the service's catalog.
func (s *Service) Catalog() Catalog { return Catalog{s} }

// Launch is what a template gives its sandboxes at create: their default
// user, workdir and environment, the start and ready commands and the
// size its build asked for (zero: the daemon's defaults).
type Launch struct {
	User     string
	Workdir  string
	Env      map[string]string
	StartCmd string
	ReadyCmd string
	CPUs     float64
	MemoryMB int64
}

// Resolve returns the root filesystem of the template name; an unknown
// name is an error wrapping api.ErrNotFound.
func (c Catalog) Resolve(name string) (string, error) {
	if p, ok, err := c.s.resolveBuilt(name); ok {
		return p, err
	}
	return c.s.opts.Parents.Resolve(name)
}

// ReadyPorts are the ports a sandbox of fence's template name serves once
// started.
func (c Catalog) ReadyPorts(name string) []uint16 { return c.s.opts.Parents.ReadyPorts(name) }

// Identity gives a built template's ID and alias; fence's own templates
// are their name, which is both.
func (c Catalog) Identity(name string) (id, alias string, ok bool) {
	if id, alias, ok := c.s.identity(name); ok {
		return id, alias, true
	}
	if _, err := c.s.opts.Parents.Resolve(name); err == nil {
		return name, name, true
	}
	return "", "", false
}

// Launch gives what a built template's build left for its sandboxes, or
// what the image a fence template was made from sets.
func (c Catalog) Launch(name string) (Launch, bool) {
	rt, ok := c.s.runtime(name)
	if !ok {
		return c.ownLaunch(name)
	}
	return Launch{User: rt.User, Workdir: rt.Workdir, StartCmd: rt.StartCmd, ReadyCmd: rt.ReadyCmd,
		CPUs: float64(rt.CPUs), MemoryMB: int64(rt.MemoryMB)}, true
}

// ownLaunch gives a template built from a container image its image's
// environment, working directory and user (when the user is a name; a
// numeric uid is left to the template's default user).
func (c Catalog) ownLaunch(name string) (Launch, bool) {
	info, err := c.s.opts.Parents.Info(name)
	if err != nil || (len(info.Env) == 0 && info.WorkDir == "" && info.User == "") {
		return Launch{}, false
	}
	l := Launch{Workdir: info.WorkDir}
	if u, _, _ := strings.Cut(info.User, ":"); u != "" && strings.Trim(u, "0123456789") != "" {
		l.User = u
	}
	for _, kv := range info.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			if l.Env == nil {
				l.Env = map[string]string{}
			}
			l.Env[k] = v
		}
	}
	return l, true
}
