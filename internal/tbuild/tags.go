package tbuild

import (
	"context"

	"github.com/fencesandbox/fence/internal/tbuild/names"
)

// TagInfo is one tag of a template.
type TagInfo = names.TagInfo

// AssignTags points tags at the build target ("name[:tag]") resolves to
// (names.Registry.AssignTags).
func (s *Service) AssignTags(ctx context.Context, target string, tags []string) (string, []string, error) {
	return s.names.AssignTags(ctx, target, tags)
}

// RemoveTags removes tags of the template name (which must have no tag).
func (s *Service) RemoveTags(ctx context.Context, name string, tags []string) error {
	return s.names.RemoveTags(ctx, name, tags)
}

// Tags lists a template's tags.
func (s *Service) Tags(idOrName string) ([]TagInfo, error) {
	return s.names.Tags(idOrName)
}
