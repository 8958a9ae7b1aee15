package names

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TagRef is where a tag points.
type TagRef struct {
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// Template is a built template's record.
type Template struct {
	ID        string            `json:"id"`
	Alias     string            `json:"alias"`
	CreatedAt time.Time         `json:"createdAt"`
	UpdatedAt time.Time         `json:"updatedAt"`
	Public    bool              `json:"public"`
	Tags      map[string]TagRef `json:"tags"`
	// Team owns the template ("": the default team, for records made
	// before teams).
	Team string `json:"team,omitempty"`
}

// clone is a copy of t that shares nothing with it.
func (t *Template) clone() Template {
	c := *t
	c.Tags = maps.Clone(t.Tags)
	return c
}

// DocStore persists the records; *store.Store implements it.
type DocStore interface {
	PutTemplateDoc(ctx context.Context, d store.Doc) error
	DeleteTemplateDoc(ctx context.Context, id string) error
	TemplateDocs(ctx context.Context) ([]store.Doc, error)
}

// Options configure a Registry.
type Options struct {
	Store DocStore // required
	// Namespace is the team slug names are shown under; empty "fence".
	Namespace string
	Logger    *slog.Logger
	Now       func() time.Time
}

// Registry is the names service: the built templates' records (ID, alias,
// visibility, tags) and which of their builds are ready. It is safe for
// concurrent use; it never calls out while it holds its lock.
type Registry struct {
	opts Options
	log  *slog.Logger
	now  func() time.Time

	mu sync.Mutex
	// +checklocks:mu
	templates map[string]*Template // by ID
	// +checklocks:mu
	ready map[string]string // ready build ID → template ID
}

// Open reads the template records.
func Open(ctx context.Context, opts Options) (*Registry, error) {
	if opts.Store == nil {
		return nil, errors.New("names: Store is required")
	}
	if opts.Namespace == "" {
		opts.Namespace = "fence"
	}
	r := &Registry{opts: opts, log: opts.Logger, now: opts.Now, templates: map[string]*Template{}, ready: map[string]string{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.now == nil {
		r.now = time.Now
	}
	docs, err := opts.Store.TemplateDocs(ctx)
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		var t Template
		if err := json.Unmarshal(d.JSON, &t); err != nil {
			r.log.Warn("skipping a corrupt template record", "id", d.ID, "err", err)
			continue
		}
		if t.Tags == nil {
			t.Tags = map[string]TagRef{}
		}
		r.templates[t.ID] = &t
	}
	return r, nil
}

// Namespace is the team slug names are shown under.
func (r *Registry) Namespace() string { return r.opts.Namespace }

// Names are the names a template of alias alias is shown under.
func (r *Registry) Names(alias string) []string { return []string{r.opts.Namespace + "/" + alias} }

// Save writes template id's record, as it is now, to the store (outside
// the registry's lock). Claim, Publish and Forget change the records in
// memory only, so that their callers may call them under a lock of their
// own and Save (or Erase) once they hold none.
func (r *Registry) Save(ctx context.Context, id string) {
	r.mu.Lock()
	t, ok := r.templates[id]
	var b []byte
	var err error
	var alias string
	if ok {
		b, err = json.Marshal(t)
		alias = t.Alias
	}
	r.mu.Unlock()
	if !ok {
		return
	}
	if err == nil {
		err = r.opts.Store.PutTemplateDoc(context.WithoutCancel(ctx), store.Doc{ID: id, Key: alias, JSON: b})
	}
	if err != nil {
		r.log.Error("recording a template", "id", id, "err", err)
	}
}

// Claim returns the template called n.Alias, made (with a new ID) if there
// is none; an alias that is another template's ID is a conflict. The
// record is in memory until Save.
func (r *Registry) Claim(n Name) (Template, error) {
	return r.ClaimFor(n, tenancy.DefaultTeamID)
}

// ClaimFor is Claim for team: a template made is team's, and an alias
// another team's template has is taken (aliases are one namespace, as on
// E2B).
func (r *Registry) ClaimFor(n Name, team string) (Template, error) {
	now := r.now().UTC()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, taken := r.templates[n.Alias]; taken {
		return Template{}, fmt.Errorf("Alias '%s' is already used: %w", n.Alias, api.ErrConflict)
	}
	t := r.byAliasLocked(n.Alias)
	if t != nil && tenancy.Owner(t.Team) != team {
		return Template{}, fmt.Errorf("Alias '%s' is already used: %w", n.Alias, api.ErrConflict)
	}
	if t == nil {
		t = &Template{ID: newID(20), Alias: n.Alias, CreatedAt: now, Tags: map[string]TagRef{}, Team: team}
		r.templates[t.ID] = t
	}
	t.UpdatedAt = now
	return t.clone(), nil
}

// Ready records that build buildID of template templateID is ready: a
// name may select it (by a tag, or by its ID as the tag).
func (r *Registry) Ready(templateID, buildID string) {
	r.mu.Lock()
	r.ready[buildID] = templateID
	r.mu.Unlock()
}

// Publish records build buildID of template templateID as ready and
// points tags at it. The record is in memory until Save.
func (r *Registry) Publish(templateID, buildID string, tags []string) {
	now := r.now().UTC()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready[buildID] = templateID
	t := r.templates[templateID]
	if t == nil {
		return
	}
	for _, tag := range tags {
		t.Tags[tag] = TagRef{BuildID: buildID, CreatedAt: now}
	}
	t.UpdatedAt = now
}

// Forget forgets template id and its ready builds, in memory; Erase
// deletes its record.
func (r *Registry) Forget(id string) {
	r.mu.Lock()
	delete(r.templates, id)
	for b, tid := range r.ready {
		if tid == id {
			delete(r.ready, b)
		}
	}
	r.mu.Unlock()
}

// Erase deletes template id's record from the store.
func (r *Registry) Erase(ctx context.Context, id string) error {
	return r.opts.Store.DeleteTemplateDoc(context.WithoutCancel(ctx), id)
}

// +checklocks:r.mu
func (r *Registry) byAliasLocked(alias string) *Template {
	for _, t := range r.templates {
		if t.Alias == alias {
			return t
		}
	}
	return nil
}

// Get returns the template of ID id.
func (r *Registry) Get(id string) (Template, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.templates[id]
	if !ok {
		return Template{}, false
	}
	return t.clone(), true
}

// All returns every template.
func (r *Registry) All() []Template {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Template, 0, len(r.templates))
	for _, t := range r.templates {
		out = append(out, t.clone())
	}
	return out
}

// Lookup finds a template by ID or name (a tag is ignored).
func (r *Registry) Lookup(idOrName string) (Template, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, err := r.lookupLocked(idOrName)
	if err != nil {
		return Template{}, err
	}
	return t.clone(), nil
}

// +checklocks:r.mu
func (r *Registry) lookupLocked(idOrName string) (*Template, error) {
	if t, ok := r.templates[idOrName]; ok {
		return t, nil
	}
	n, err := ParseName(idOrName)
	if err != nil {
		return nil, err
	}
	if n.Namespace != "" && n.Namespace != r.opts.Namespace {
		return nil, fmt.Errorf("template %q not found: %w", idOrName, api.ErrNotFound)
	}
	if t := r.byAliasLocked(n.Alias); t != nil {
		return t, nil
	}
	if t, ok := r.templates[n.Alias]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("template %q not found: %w", idOrName, api.ErrNotFound)
}

// Knows reports whether n's alias names a template (by alias or ID).
func (r *Registry) Knows(n Name) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byAliasLocked(n.Alias) != nil || r.templates[n.Alias] != nil
}

// Resolve finds the ready build a name selects: the build its tag
// (default when none) points at, or the ready build of the template whose
// ID the tag is.
func (r *Registry) Resolve(n Name) (Template, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, b, err := r.resolveLocked(n)
	if err != nil {
		return Template{}, "", err
	}
	return t.clone(), b, nil
}

// +checklocks:r.mu
func (r *Registry) resolveLocked(n Name) (*Template, string, error) {
	if n.Namespace != "" && n.Namespace != r.opts.Namespace {
		return nil, "", fmt.Errorf("template %s/%s not found: %w", n.Namespace, n.Alias, api.ErrNotFound)
	}
	t := r.byAliasLocked(n.Alias)
	if t == nil {
		t = r.templates[n.Alias]
	}
	if t == nil {
		return nil, "", fmt.Errorf("template %q not found: %w", n.Alias, api.ErrNotFound)
	}
	tag := n.TagOrDefault()
	var b string
	if uuidRE.MatchString(tag) {
		b = tag
	} else if ref, ok := t.Tags[tag]; ok {
		b = ref.BuildID
	}
	if b == "" || r.ready[b] != t.ID {
		return nil, "", fmt.Errorf("Template '%s' with tag '%s' not found: tag '%s' does not exist for template '%s': %w", n.Alias, tag, tag, n.Alias, api.ErrNotFound)
	}
	return t, b, nil
}

// SetPublic sets (when public is not nil) whether a template is public
// and returns its names.
func (r *Registry) SetPublic(ctx context.Context, id string, public *bool) ([]string, error) {
	r.mu.Lock()
	t, ok := r.templates[id]
	if !ok {
		r.mu.Unlock()
		return nil, fmt.Errorf("template %q not found: %w", id, api.ErrNotFound)
	}
	if public != nil {
		t.Public = *public
		t.UpdatedAt = r.now().UTC()
	}
	names := r.Names(t.Alias)
	r.mu.Unlock()
	if public != nil {
		r.Save(ctx, id)
	}
	return names, nil
}

// Alias answers GET /templates/aliases/{alias} for a built template: its
// ID and whether it is public; found is false when no built template has
// the alias.
func (r *Registry) Alias(n Name) (id string, public, found bool, err error) {
	if n.Namespace != "" && n.Namespace != r.opts.Namespace {
		return "", false, false, fmt.Errorf("namespace %q is not this server's: %w", n.Namespace, api.ErrInvalidArgument)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.byAliasLocked(n.Alias)
	if t == nil {
		return "", false, false, nil
	}
	if n.Tag != "" {
		if _, ok := t.Tags[n.Tag]; !ok {
			return "", false, true, fmt.Errorf("tag '%s' does not exist for template '%s': %w", n.Tag, n.Alias, api.ErrNotFound)
		}
	}
	return t.ID, t.Public, true, nil
}

// TagInfo is one tag of a template.
type TagInfo struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// Tags lists a template's tags.
func (r *Registry) Tags(idOrName string) ([]TagInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, err := r.lookupLocked(idOrName)
	if err != nil {
		return nil, err
	}
	out := []TagInfo{}
	for _, tag := range slices.Sorted(maps.Keys(t.Tags)) {
		ref := t.Tags[tag]
		out = append(out, TagInfo{Tag: tag, BuildID: ref.BuildID, CreatedAt: ref.CreatedAt})
	}
	return out, nil
}

func newID(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// Adopt records t, a template made on another node of the cluster, under
// its own ID and team: a record of that ID takes t's alias, team and
// visibility and keeps its tags (Publish points them); another template
// holding t's alias is a conflict, and changes nothing. The record is in
// memory until Save.
func (r *Registry) Adopt(t Template) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if o := r.byAliasLocked(t.Alias); o != nil && o.ID != t.ID {
		return fmt.Errorf("Alias '%s' is already used by template %s on this node: %w", t.Alias, o.ID, api.ErrConflict)
	}
	if cur, ok := r.templates[t.ID]; ok {
		cur.Alias, cur.Team, cur.Public = t.Alias, t.Team, t.Public
		cur.UpdatedAt = r.now().UTC()
		return nil
	}
	c := t.clone()
	c.Tags = map[string]TagRef{}
	r.templates[t.ID] = &c
	return nil
}
