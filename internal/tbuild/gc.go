package tbuild

import (
	"context"
	"slices"

	"github.com/fencesandbox/fence/internal/tbuild/content"
	"github.com/fencesandbox/fence/internal/tbuild/names"
)

// collect runs one collection of the content store (content.Collect):
// the records' trees, the archives of builds in progress, the tombstones
// a live sandbox of sbs names. Without sbs (nil) tombstones are all
// kept. It runs under s.mu, so no build changes its record or pins
// meanwhile.
func (s *Service) collect(ctx context.Context, sbs Sandboxes) {
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	c := content.Collection{InFlight: true}
	if sbs != nil {
		c.InFlight = sbs.CreatesInFlight() > 0
		if live, err := sbs.Live(ctx); err != nil {
			s.log.Warn("template layer collection: listing sandboxes", "err", err)
		} else {
			c.Live = func(t content.Tombstone) bool {
				return slices.ContainsFunc(live, func(sb LiveSandbox) bool { return usesTemplate(sb.Template, t.ID, t.Alias) })
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.builds {
		c.Records = append(c.Records, treesOf(b)...)
	}
	c.Archives = s.runningArchivesLocked()
	s.content.Collect(c)
}

// runningArchivesLocked returns the files hashes builds in progress name.
// +checklocks:s.mu
func (s *Service) runningArchivesLocked() map[string]bool {
	keep := map[string]bool{}
	for id := range s.running {
		if b := s.builds[id]; b != nil && b.Spec != nil {
			for _, st := range b.Spec.Steps {
				if st.FilesHash != "" {
					keep[st.FilesHash] = true
				}
			}
		}
	}
	return keep
}

// sweepArchives removes the COPY archives no build in progress names and
// none used lately (content.Store.SweepArchives).
func (s *Service) sweepArchives() {
	s.mu.Lock()
	keep := s.runningArchivesLocked()
	s.mu.Unlock()
	s.content.SweepArchives(keep)
}

// usesTemplate reports whether a sandbox's template name names the
// template id (alias alias), with or without a tag or namespace.
func usesTemplate(name, id, alias string) bool {
	n, err := names.ParseName(name)
	return err == nil && (n.Alias == alias || n.Alias == id)
}
