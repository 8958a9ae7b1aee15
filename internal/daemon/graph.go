package daemon

import (
	"context"
	"fmt"
)

// component is one part of the daemon, in the manner of a plugin
// registration: its name, the components it requires started before it,
// and start, which makes the part from what those made (node fields set by
// them) and pushes its teardown on the node's closers as soon as there is
// something to undo. What a component provides is what its start sets on
// the node; a component reads only what its requirements provide.
type component struct {
	name     string
	requires []string
	start    func(d *node, ctx context.Context) error
}

// order returns comps so that each comes after every component it
// requires. Among the components whose requirements have started it takes
// the one listed first, so a list already in dependency order keeps its
// order. An unknown or duplicate name, or a cycle, is an error.
func order(comps []component) ([]component, error) {
	index := make(map[string]int, len(comps))
	for i, c := range comps {
		if _, dup := index[c.name]; dup {
			return nil, fmt.Errorf("daemon: component %q listed twice", c.name)
		}
		index[c.name] = i
	}
	for _, c := range comps {
		for _, r := range c.requires {
			if _, ok := index[r]; !ok {
				return nil, fmt.Errorf("daemon: component %q requires %q, which is not a component", c.name, r)
			}
		}
	}
	started := make([]bool, len(comps))
	out := make([]component, 0, len(comps))
	for len(out) < len(comps) {
		next := -1
		for i, c := range comps {
			if !started[i] && requirementsStarted(c, index, started) {
				next = i
				break
			}
		}
		if next < 0 {
			var left []string
			for i, c := range comps {
				if !started[i] {
					left = append(left, c.name)
				}
			}
			return nil, fmt.Errorf("daemon: components %q require each other", left)
		}
		started[next] = true
		out = append(out, comps[next])
	}
	return out, nil
}

func requirementsStarted(c component, index map[string]int, started []bool) bool {
	for _, r := range c.requires {
		if !started[index[r]] {
			return false
		}
	}
	return true
}

// run starts comps in dependency order, then calls serve. Whatever
// happens, a clean return, a failed start or a panic, the closers the
// started components pushed run in reverse order before run returns: a
// component that fails to start pushes nothing it did not finish, and the
// ones after it never start.
func (d *node) run(ctx context.Context, comps []component, serve func(context.Context) error) error {
	defer d.closers.close()
	sorted, err := order(comps)
	if err != nil {
		return err
	}
	for _, c := range sorted {
		if err := c.start(d, ctx); err != nil {
			return err
		}
		d.log.Debug("started", "component", c.name)
	}
	return serve(ctx)
}
