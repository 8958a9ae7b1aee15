package tbuild

import (
	"fmt"

	"github.com/fencesandbox/fence/api"
)

// Alias answers GET /templates/aliases/{alias}: the template's ID and
// whether it is public. fence's own templates (minimal, base, …) are
// public.
func (s *Service) Alias(name string) (id string, public bool, err error) {
	n, err := ParseName(name)
	if err != nil {
		return "", false, err
	}
	if n.Namespace != "" && n.Namespace != s.opts.Namespace {
		return "", false, fmt.Errorf("namespace %q is not this server's: %w", n.Namespace, api.ErrInvalidArgument)
	}
	s.mu.Lock()
	t := s.byAliasLocked(n.Alias)
	if t != nil {
		if n.Tag != "" {
			if _, ok := t.Tags[n.Tag]; !ok {
				s.mu.Unlock()
				return "", false, fmt.Errorf("tag '%s' does not exist for template '%s': %w", n.Tag, n.Alias, api.ErrNotFound)
			}
		}
		id, public := t.ID, t.Public
		s.mu.Unlock()
		return id, public, nil
	}
	s.mu.Unlock()
	if n.Tag == "" {
		if _, err := s.opts.Parents.Resolve(n.Alias); err == nil {
			return n.Alias, true, nil
		}
	}
	return "", false, fmt.Errorf("template %q not found: %w", name, api.ErrNotFound)
}

// resolveLocked finds the ready build a name selects: the newest ready
// build its tag (default when none) points at, or the build whose UUID
// the tag is.
// +checklocks:s.mu
func (s *Service) resolveLocked(n Name) (*Template, *Build, error) {
	if n.Namespace != "" && n.Namespace != s.opts.Namespace {
		return nil, nil, fmt.Errorf("template %s/%s not found: %w", n.Namespace, n.Alias, api.ErrNotFound)
	}
	t := s.byAliasLocked(n.Alias)
	if t == nil {
		t = s.templates[n.Alias]
	}
	if t == nil {
		return nil, nil, fmt.Errorf("template %q not found: %w", n.Alias, api.ErrNotFound)
	}
	tag := n.TagOrDefault()
	var b *Build
	if uuidRE.MatchString(tag) {
		b = s.builds[tag]
	} else if r, ok := t.Tags[tag]; ok {
		b = s.builds[r.BuildID]
	}
	if b == nil || b.TemplateID != t.ID || b.Status != StatusReady {
		return nil, nil, fmt.Errorf("Template '%s' with tag '%s' not found: tag '%s' does not exist for template '%s': %w", n.Alias, tag, tag, n.Alias, api.ErrNotFound)
	}
	return t, b, nil
}

// Resolve returns the root filesystem of the template a sandbox create
// names (a built template's name[:tag] or ID, or a build sandbox's
// layer); ok is false when the name is none of these.
func (s *Service) Resolve(name string) (rootfs string, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p, found := s.layers[name]; found {
		return p, true, nil
	}
	n, perr := ParseName(name)
	if perr != nil {
		return "", false, nil
	}
	if s.byAliasLocked(n.Alias) == nil && s.templates[n.Alias] == nil {
		return "", false, nil
	}
	_, b, err := s.resolveLocked(n)
	if err != nil {
		return "", true, err
	}
	s.content.Lease(b.Tree)
	return s.content.TreePath(b.Tree), true, nil
}

// Identity returns the ID and alias of the built template a sandbox
// create names (alias[:tag], namespace/alias or ID); ok is false when it
// names no ready build of one.
func (s *Service) Identity(name string) (id, alias string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := ParseName(name)
	if err != nil {
		return "", "", false
	}
	t, _, err := s.resolveLocked(n)
	if err != nil {
		return "", "", false
	}
	return t.ID, t.Alias, true
}

// Runtime returns the start command, ready command, default user and
// workdir of the built template a sandbox create names.
func (s *Service) Runtime(name string) (Runtime, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rt, ok := s.boxRuntimes[name]; ok {
		return rt, true
	}
	n, err := ParseName(name)
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
