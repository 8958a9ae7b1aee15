package tbuild

import (
	"fmt"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tbuild/names"
)

// Alias answers GET /templates/aliases/{alias}: the template's ID and
// whether it is public. fence's own templates (minimal, base, …) are
// public.
func (s *Service) Alias(name string) (id string, public bool, err error) {
	n, err := names.ParseName(name)
	if err != nil {
		return "", false, err
	}
	id, public, found, err := s.names.Alias(n)
	if found || err != nil {
		return id, public, err
	}
	if n.Tag == "" {
		if _, err := s.opts.Parents.Resolve(n.Alias); err == nil {
			return n.Alias, true, nil
		}
	}
	ctx, cancel := indexCtx()
	defer cancel()
	if rec, err := s.indexed(ctx, n.Alias); err != nil {
		return "", false, err
	} else if rec != nil && rec.Alias == n.Alias {
		return rec.ID, rec.Public, nil // a template of the cluster this node has not pulled
	}
	return "", false, fmt.Errorf("template %q not found: %w", name, api.ErrNotFound)
}

// resolveLocked finds the ready build a name selects
// (names.Registry.Resolve) and its record.
// +checklocks:s.mu
func (s *Service) resolveLocked(n names.Name) (names.Template, *Build, error) {
	t, id, err := s.names.Resolve(n)
	if err != nil {
		return names.Template{}, nil, err
	}
	b := s.builds[id]
	if b == nil || b.TemplateID != t.ID || b.Status != StatusReady {
		return names.Template{}, nil, fmt.Errorf("template %q has no ready build %s: %w", n.Alias, id, api.ErrNotFound)
	}
	return t, b, nil
}

// resolveBuilt returns the root filesystem of the template a sandbox create
// names (a built template's name[:tag] or ID, or a build sandbox's
// layer); ok is false when the name is none of these.
func (s *Service) resolveBuilt(name string) (rootfs string, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, found := s.layers[name]; found {
		return p, true, nil
	}
	n, perr := names.ParseName(name)
	if perr != nil || !s.names.Knows(n) {
		return "", false, nil
	}
	_, b, err := s.resolveLocked(n)
	if err != nil {
		return "", true, err
	}
	s.content.Lease(b.Tree)
	return s.content.TreePath(b.Tree), true, nil
}

// identity returns the ID and alias of the built template a sandbox
// create names (alias[:tag], namespace/alias or ID); ok is false when it
// names no ready build of one.
func (s *Service) identity(name string) (id, alias string, ok bool) {
	n, err := names.ParseName(name)
	if err != nil {
		return "", "", false
	}
	t, _, err := s.names.Resolve(n)
	if err != nil {
		return "", "", false
	}
	return t.ID, t.Alias, true
}

// runtime returns the start command, ready command, default user and
// workdir of the built template a sandbox create names.
func (s *Service) runtime(name string) (Runtime, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rt, ok := s.boxRuntimes[name]; ok {
		return rt, true
	}
	n, err := names.ParseName(name)
	if err != nil {
		return Runtime{}, false
	}
	_, b, err := s.resolveLocked(n)
	if err != nil {
		return Runtime{}, false
	}
	rt := b.Runtime
	rt.CPUs, rt.MemoryMB = b.CPUs, b.MemoryMB
	return rt, true
}
