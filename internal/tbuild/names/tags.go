package names

import (
	"context"
	"fmt"
	"strings"

	"github.com/fencesandbox/fence/api"
)

// AssignTags points tags at the ready build target ("name[:tag]")
// selects and returns its ID and the tags as kept.
func (r *Registry) AssignTags(ctx context.Context, target string, tags []string) (string, []string, error) {
	if len(tags) == 0 {
		return "", nil, fmt.Errorf("tags are required: %w", api.ErrInvalidArgument)
	}
	n, err := ParseName(target)
	if err != nil {
		return "", nil, err
	}
	var clean []string
	for _, t := range tags {
		c, ok := CleanTag(t)
		if !ok {
			return "", nil, fmt.Errorf("invalid tag %q: %w", c, api.ErrInvalidArgument)
		}
		clean = append(clean, c)
	}
	r.mu.Lock()
	t, b, err := r.resolveLocked(n)
	if err != nil {
		r.mu.Unlock()
		return "", nil, err
	}
	now := r.now().UTC()
	for _, tag := range clean {
		t.Tags[tag] = TagRef{BuildID: b, CreatedAt: now}
	}
	t.UpdatedAt = now
	id := t.ID
	r.mu.Unlock()
	r.Save(ctx, id)
	return b, clean, nil
}

// RemoveTags removes tags of the template name (which must have no tag);
// the default tag cannot be removed.
func (r *Registry) RemoveTags(ctx context.Context, name string, tags []string) error {
	n, err := ParseName(name)
	if err != nil {
		return err
	}
	if n.Tag != "" || strings.Contains(name, ":") {
		return fmt.Errorf("name %q must not hold a tag: %w", name, api.ErrInvalidArgument)
	}
	if len(tags) == 0 {
		return fmt.Errorf("tags are required: %w", api.ErrInvalidArgument)
	}
	r.mu.Lock()
	t, err := r.lookupLocked(name)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	for _, tag := range tags {
		tag = strings.ToLower(strings.TrimSpace(tag))
		if tag == DefaultTag {
			r.mu.Unlock()
			return fmt.Errorf("the default tag cannot be removed: %w", api.ErrInvalidArgument)
		}
		if _, ok := t.Tags[tag]; !ok {
			r.mu.Unlock()
			return fmt.Errorf("Template '%s' with tag '%s' not found: %w", name, tag, api.ErrNotFound)
		}
	}
	for _, tag := range tags {
		delete(t.Tags, strings.ToLower(strings.TrimSpace(tag)))
	}
	t.UpdatedAt = r.now().UTC()
	id := t.ID
	r.mu.Unlock()
	r.Save(ctx, id)
	return nil
}
