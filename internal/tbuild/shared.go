package tbuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tbuild/content"
	"github.com/fencesandbox/fence/internal/tbuild/names"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// A cluster's built templates move between its nodes through its content
// registry (Options.Registry) and its shared index (Options.Shared):
//
//   - A build that succeeds pushes its tree, with its template and build
//     records as the image's meta, and records the template's name →
//     (digest, team, build time) in the shared index, before it reports
//     ready; a push that fails fails the build.
//   - A create of a template this node lacks, or whose newest build it
//     lacks, looks it up in the index (as its team sees it: another
//     team's private template answers as an unknown one) and pulls it by
//     digest, verified, into the content store; concurrent creates wait
//     on one pull.
//   - A template whose record is gone from the index (deleted through
//     another node) is dropped from this node at its next use here, as a
//     deletion would (its trees wait for its last live sandbox).
//   - The template routes (list, get, delete) answer from the index, so
//     every node answers alike.

// ContentRegistry moves trees to and from the cluster's content registry;
// *contentreg.Registry implements it.
type ContentRegistry interface {
	PushTree(ctx context.Context, repo, tag, dir string, meta []byte) (digest string, err error)
	PullTree(ctx context.Context, repo, digest, dir string) (meta []byte, err error)
}

// SharedIndex is the cluster's index of built templates; *store.Store
// implements it.
type SharedIndex interface {
	PutSharedTemplate(ctx context.Context, t *store.SharedTemplate) error
	SharedTemplate(ctx context.Context, idOrAlias string) (*store.SharedTemplate, error)
	SharedTemplates(ctx context.Context) ([]store.SharedTemplate, error)
	DeleteSharedTemplate(ctx context.Context, id string) error
	SetSharedTemplatePublic(ctx context.Context, id string, public bool) error
}

// sharedMeta is the meta of a template's image in the content registry.
type sharedMeta struct {
	Template names.Template `json:"template"`
	Build    Build          `json:"build"`
}

// indexTimeout bounds an index lookup made for a route that carries no
// context.
const indexTimeout = 10 * time.Second

// shares reports whether templates move through a content registry.
func (s *Service) shares() bool { return s.opts.Registry != nil && s.opts.Shared != nil }

// repoOf is the repository of template id's images.
func repoOf(id string) string { return "templates/" + id }

// share pushes the tree of build buildID (ready, with runtime rt) to the
// content registry and records it in the index; it returns the image's
// digest. A build deleted meanwhile shares nothing.
func (s *Service) share(ctx context.Context, buildID, tree string, rt Runtime) (string, error) {
	now := s.now().UTC()
	s.mu.Lock()
	rec := s.builds[buildID]
	if rec == nil {
		s.mu.Unlock()
		return "", nil
	}
	b := *rec
	s.mu.Unlock()
	t, ok := s.names.Get(b.TemplateID)
	if !ok {
		return "", nil
	}
	b.Status, b.Runtime, b.FinishedAt, b.UpdatedAt = StatusReady, rt, &now, now
	b.Tree, b.Layers, b.Logs, b.Reason = "", nil, nil, nil
	t.Tags = nil
	meta, err := json.Marshal(sharedMeta{Template: t, Build: b})
	if err != nil {
		return "", err
	}
	digest, err := s.opts.Registry.PushTree(ctx, repoOf(t.ID), b.ID, s.content.TreePath(tree), meta)
	if err != nil {
		return "", err
	}
	if err := s.opts.Shared.PutSharedTemplate(ctx, &store.SharedTemplate{ID: t.ID, Alias: t.Alias, Team: tenancy.Owner(t.Team),
		Public: t.Public, BuildID: b.ID, Digest: digest, BuiltAt: now, Node: s.opts.Node, Meta: meta}); err != nil {
		return "", fmt.Errorf("recording the template in the cluster's index: %w", err)
	}
	return digest, nil
}

// pullCall is one pull that concurrent creates wait on.
type pullCall struct {
	done chan struct{}
	err  error
}

// Fetch makes the template a sandbox create acting for ctx names present
// on this node when the cluster has it and this node lacks it (or its
// newest build): see the comment at the top of this file. A name the
// index does not hold for ctx's team is left to the resolution that
// follows (which answers as before).
func (c Catalog) Fetch(ctx context.Context, name string) error { return c.s.fetch(ctx, name) }

func (s *Service) fetch(ctx context.Context, name string) error {
	if !s.shares() {
		return nil
	}
	s.mu.Lock()
	_, isLayer := s.layers[name]
	s.mu.Unlock()
	if isLayer {
		return nil
	}
	if _, err := s.opts.Parents.Resolve(name); err == nil {
		return nil // fence's own templates are on every node
	}
	n, err := names.ParseName(name)
	if err != nil || (n.Namespace != "" && n.Namespace != s.names.Namespace()) {
		return nil
	}
	rec, err := s.opts.Shared.SharedTemplate(ctx, n.Alias)
	if errors.Is(err, api.ErrNotFound) {
		if t, err := s.names.Lookup(n.Alias); err == nil && s.fromIndex(t.ID) {
			s.dropLocal(ctx, t)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking template %q up in the cluster's index: %w", name, err)
	}
	if rec.Team != tenancy.TeamOf(ctx) && !rec.Public {
		return nil
	}
	s.mu.Lock()
	b := s.builds[rec.BuildID]
	have := b != nil && b.Status == StatusReady && b.TemplateID == rec.ID
	s.mu.Unlock()
	if have {
		return nil
	}
	return s.pullOnce(ctx, rec)
}

// fromIndex reports whether template id came through the index (a build
// of it was pushed or pulled): only such a template is dropped when its
// record is gone, not one built before the node had a registry.
func (s *Service) fromIndex(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.builds {
		if b.TemplateID == id && b.ContentDigest != "" {
			return true
		}
	}
	return false
}

// pullOnce pulls rec, or waits for the pull of it in progress.
func (s *Service) pullOnce(ctx context.Context, rec *store.SharedTemplate) error {
	s.mu.Lock()
	if c, ok := s.pulls[rec.Digest]; ok {
		s.mu.Unlock()
		select {
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := &pullCall{done: make(chan struct{})}
	s.pulls[rec.Digest] = c
	s.mu.Unlock()
	// The pull outlives a first caller that gives up: others may wait on it.
	c.err = s.pull(context.WithoutCancel(ctx), rec)
	s.mu.Lock()
	delete(s.pulls, rec.Digest)
	s.mu.Unlock()
	close(c.done)
	return c.err
}

// pull fetches rec's image into a new tree and records its template and
// build as this node's.
func (s *Service) pull(ctx context.Context, rec *store.SharedTemplate) error {
	start := time.Now()
	if t, err := s.names.Lookup(rec.Alias); err == nil && t.ID != rec.ID {
		if !s.fromIndex(t.ID) {
			return fmt.Errorf("template %q of the cluster: this node has a template of that name of its own: %w", rec.Alias, api.ErrConflict)
		}
		s.dropLocal(ctx, t) // deleted in the cluster and made again since
	}
	tmp, err := s.content.TempDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")
	raw, err := s.opts.Registry.PullTree(ctx, repoOf(rec.ID), rec.Digest, root)
	if err != nil {
		return fmt.Errorf("pulling template %q from the cluster's content registry: %w: %w", rec.Alias, err, api.ErrUnavailable)
	}
	var meta sharedMeta
	if err := json.Unmarshal(raw, &meta); err != nil || meta.Template.ID != rec.ID || meta.Build.ID != rec.BuildID {
		return fmt.Errorf("template %q: its image in the content registry is not build %s's: %w", rec.Alias, rec.BuildID, api.ErrUnavailable)
	}
	name := "l-" + newID(24)
	owner := "pull-" + rec.BuildID
	s.content.Pin(owner, name)
	defer s.content.Unpin(owner)
	if err := s.content.Place(root, name); err != nil {
		return err
	}
	b := meta.Build
	b.Status, b.Tree, b.Layers, b.ContentDigest = StatusReady, name, nil, rec.Digest
	t := meta.Template
	t.Alias, t.Team, t.Public = rec.Alias, rec.Team, rec.Public
	s.mu.Lock()
	if err := s.names.Adopt(t); err != nil {
		s.mu.Unlock()
		return err
	}
	s.builds[b.ID] = &b
	s.names.Publish(t.ID, b.ID, b.Tags)
	s.mu.Unlock()
	s.names.Save(ctx, t.ID)
	s.saveBuild(ctx, &b)
	s.log.Info("template pulled from the cluster's content registry", "template", rec.Alias, "id", rec.ID,
		"build", rec.BuildID, "digest", rec.Digest, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// dropLocal removes template t from this node as a deletion does, without
// asking which sandboxes use it (its trees wait for the last of them).
func (s *Service) dropLocal(ctx context.Context, t names.Template) {
	s.mu.Lock()
	sbs := s.sandboxes
	s.mu.Unlock()
	if err := s.removeLocal(ctx, t, sbs); err != nil {
		s.log.Warn("dropping a template deleted in the cluster", "template", t.Alias, "err", err)
		return
	}
	s.log.Info("dropped a template deleted in the cluster", "template", t.Alias, "id", t.ID)
}

// removeLocal removes template t's records and trees from this node: the
// tombstone first (a crash after it leaves the trees to the next
// collection, which keeps them while a sandbox names the template), then
// its builds and names.
func (s *Service) removeLocal(ctx context.Context, t names.Template, sbs Sandboxes) error {
	s.gcMu.Lock()
	s.mu.Lock()
	tomb := content.Tombstone{ID: t.ID, Alias: t.Alias}
	for _, b := range s.builds {
		if b.TemplateID == t.ID {
			tomb.Trees = append(tomb.Trees, treesOf(b)...)
		}
	}
	s.mu.Unlock()
	err := s.content.Bury(tomb)
	s.gcMu.Unlock()
	if err != nil {
		return fmt.Errorf("deleting template %s: %w", t.Alias, err)
	}
	s.mu.Lock()
	if _, ok := s.names.Get(t.ID); !ok {
		s.mu.Unlock()
		return fmt.Errorf("template %q not found: %w", t.Alias, api.ErrNotFound)
	}
	for id, b := range s.builds {
		if b.TemplateID == t.ID {
			if c, ok := s.running[id]; ok {
				c()
			}
			delete(s.builds, id)
		}
	}
	s.names.Forget(t.ID)
	s.mu.Unlock()
	if err := s.names.Erase(ctx, t.ID); err != nil {
		return err
	}
	s.collect(context.WithoutCancel(ctx), sbs)
	return nil
}

// indexed returns the index's record of idOrName (an ID, or a name whose
// tag is ignored), or nil when there is none or no index.
func (s *Service) indexed(ctx context.Context, idOrName string) (*store.SharedTemplate, error) {
	if !s.shares() {
		return nil, nil
	}
	key := idOrName
	if n, err := names.ParseName(idOrName); err == nil {
		if n.Namespace != "" && n.Namespace != s.names.Namespace() {
			return nil, nil
		}
		key = n.Alias
	}
	rec, err := s.opts.Shared.SharedTemplate(ctx, key)
	if errors.Is(err, api.ErrNotFound) {
		return nil, nil
	}
	return rec, err
}

// indexCtx is the context of an index lookup for a route that carries
// none.
func indexCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), indexTimeout)
}

// listed is a template as the index holds it, listed.
func (s *Service) listed(rec store.SharedTemplate) (Listed, bool) {
	var meta sharedMeta
	if err := json.Unmarshal(rec.Meta, &meta); err != nil {
		s.log.Warn("skipping a corrupt shared template record", "id", rec.ID, "err", err)
		return Listed{}, false
	}
	b := meta.Build
	return Listed{TemplateID: rec.ID, BuildID: b.ID, CPUCount: b.CPUs, MemoryMB: b.MemoryMB,
		Public: rec.Public, Aliases: []string{rec.Alias}, Names: s.names.Names(rec.Alias),
		CreatedAt: meta.Template.CreatedAt, UpdatedAt: rec.BuiltAt, BuildStatus: StatusReady, BuildCount: 1,
		EnvdVersion: EnvdVersion, Team: rec.Team}, true
}

// adoptForBuild makes the cluster's template of alias this node's, under
// its ID, before a build of it registers here: the build is then a new
// build of the cluster's template (its index record moves to it once it
// is ready) rather than a second template of that name, which the index
// would refuse. Another team's template of that alias is a conflict, as
// on one node.
func (s *Service) adoptForBuild(ctx context.Context, alias string) error {
	if !s.shares() {
		return nil
	}
	if _, err := s.names.Lookup(alias); err == nil {
		return nil
	}
	rec, err := s.indexed(ctx, alias)
	if err != nil || rec == nil {
		return err
	}
	if rec.Team != tenancy.TeamOf(ctx) {
		return fmt.Errorf("Alias '%s' is already used: %w", alias, api.ErrConflict)
	}
	var meta sharedMeta
	if err := json.Unmarshal(rec.Meta, &meta); err != nil {
		return fmt.Errorf("template %q: its record in the cluster's index is corrupt: %w", alias, err)
	}
	t := meta.Template
	t.ID, t.Alias, t.Team, t.Public = rec.ID, rec.Alias, rec.Team, rec.Public
	s.mu.Lock()
	err = s.names.Adopt(t)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.names.Save(ctx, t.ID)
	return nil
}

// cmpErr returns the first error that is not nil.
func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
