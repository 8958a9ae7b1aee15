package tbuild

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
)

// TagInfo is one tag of a template.
type TagInfo struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// AssignTags points tags at the build target ("name[:tag]") resolves to.
func (s *Service) AssignTags(ctx context.Context, target string, tags []string) (string, []string, error) {
	if len(tags) == 0 {
		return "", nil, fmt.Errorf("tags are required: %w", api.ErrInvalidArgument)
	}
	n, err := ParseName(target)
	if err != nil {
		return "", nil, err
	}
	var clean []string
	for _, t := range tags {
		t = strings.ToLower(strings.TrimSpace(t))
		if !tagRE.MatchString(t) || uuidRE.MatchString(t) {
			return "", nil, fmt.Errorf("invalid tag %q: %w", t, api.ErrInvalidArgument)
		}
		clean = append(clean, t)
	}
	s.mu.Lock()
	t, b, err := s.resolveLocked(n)
	if err != nil {
		s.mu.Unlock()
		return "", nil, err
	}
	now := s.now().UTC()
	for _, tag := range clean {
		t.Tags[tag] = TagRef{BuildID: b.ID, CreatedAt: now}
	}
	t.UpdatedAt = now
	s.mu.Unlock()
	s.saveTemplate(ctx, t)
	return b.ID, clean, nil
}

// RemoveTags removes tags of the template name (which must have no tag).
func (s *Service) RemoveTags(ctx context.Context, name string, tags []string) error {
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
	s.mu.Lock()
	t, err := s.templateLocked(name)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	for _, tag := range tags {
		tag = strings.ToLower(strings.TrimSpace(tag))
		if tag == DefaultTag {
			s.mu.Unlock()
			return fmt.Errorf("the default tag cannot be removed: %w", api.ErrInvalidArgument)
		}
		if _, ok := t.Tags[tag]; !ok {
			s.mu.Unlock()
			return fmt.Errorf("Template '%s' with tag '%s' not found: %w", name, tag, api.ErrNotFound)
		}
	}
	for _, tag := range tags {
		delete(t.Tags, strings.ToLower(strings.TrimSpace(tag)))
	}
	t.UpdatedAt = s.now().UTC()
	s.mu.Unlock()
	s.saveTemplate(ctx, t)
	return nil
}

// Tags lists a template's tags.
func (s *Service) Tags(idOrName string) ([]TagInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.templateLocked(idOrName)
	if err != nil {
		return nil, err
	}
	out := []TagInfo{}
	for _, tag := range slices.Sorted(maps.Keys(t.Tags)) {
		r := t.Tags[tag]
		out = append(out, TagInfo{Tag: tag, BuildID: r.BuildID, CreatedAt: r.CreatedAt})
	}
	return out, nil
}
