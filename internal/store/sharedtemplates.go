package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fencesandbox/fence/api"
)

// migrationSharedTemplates makes the cluster's index of built templates
// whose content is in the cluster's content registry: each template's
// newest ready build, by the digest of its image there.
const migrationSharedTemplates = `CREATE TABLE shared_templates (
	id       TEXT PRIMARY KEY,       -- the template's ID
	alias    TEXT NOT NULL UNIQUE,   -- its name
	team     TEXT NOT NULL,
	public   INTEGER NOT NULL DEFAULT 0,
	build_id TEXT NOT NULL,
	digest   TEXT NOT NULL,          -- the manifest digest in the content registry
	built_at INTEGER NOT NULL,       -- unix nanoseconds
	node     TEXT NOT NULL,          -- the node that built it
	meta     TEXT NOT NULL           -- the image's meta (JSON; the builds own its shape)
)`

// ErrSharedTemplateExists is the error of a shared template record whose
// alias another template holds.
var ErrSharedTemplateExists = fmt.Errorf("template %w: another template has this name in the cluster", api.ErrConflict)

// SharedTemplate is a built template as the cluster's nodes share it: its
// newest ready build's image in the content registry.
type SharedTemplate struct {
	ID      string
	Alias   string
	Team    string
	Public  bool
	BuildID string
	Digest  string // sha256:…
	BuiltAt time.Time
	Node    string
	Meta    []byte
}

// PutSharedTemplate inserts or replaces the record of template t.ID. An
// alias another template's record holds gives ErrSharedTemplateExists and
// changes nothing.
func (s *Store) PutSharedTemplate(ctx context.Context, t *SharedTemplate) error {
	_, err := s.shared.ExecContext(ctx, `INSERT INTO shared_templates (id, alias, team, public, build_id, digest, built_at, node, meta)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET alias = excluded.alias, team = excluded.team, public = excluded.public,
			build_id = excluded.build_id, digest = excluded.digest, built_at = excluded.built_at,
			node = excluded.node, meta = excluded.meta`,
		t.ID, t.Alias, t.Team, boolInt(t.Public), t.BuildID, t.Digest, t.BuiltAt.UnixNano(), t.Node, string(t.Meta))
	if err != nil {
		if isUniqueViolation(err) {
			return ErrSharedTemplateExists
		}
		return fmt.Errorf("recording shared template %s: %w", t.ID, err)
	}
	return nil
}

// SetSharedTemplatePublic sets whether template id is public; an unknown
// id is api.ErrNotFound.
func (s *Store) SetSharedTemplatePublic(ctx context.Context, id string, public bool) error {
	res, err := s.shared.ExecContext(ctx, `UPDATE shared_templates SET public = ? WHERE id = ?`, boolInt(public), id)
	if err != nil {
		return fmt.Errorf("updating shared template %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("shared template %q %w", id, api.ErrNotFound)
	}
	return nil
}

// SharedTemplate returns the record of the template whose ID or alias is
// idOrAlias; none is an error wrapping api.ErrNotFound.
func (s *Store) SharedTemplate(ctx context.Context, idOrAlias string) (*SharedTemplate, error) {
	row := s.shared.QueryRowContext(ctx, `SELECT id, alias, team, public, build_id, digest, built_at, node, meta
		FROM shared_templates WHERE id = ? OR alias = ? ORDER BY CASE WHEN id = ? THEN 0 ELSE 1 END LIMIT 1`,
		idOrAlias, idOrAlias, idOrAlias)
	t, err := scanSharedTemplate(row.Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("shared template %q %w", idOrAlias, api.ErrNotFound)
	}
	return t, err
}

// SharedTemplates returns every record, newest build first.
func (s *Store) SharedTemplates(ctx context.Context) ([]SharedTemplate, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT id, alias, team, public, build_id, digest, built_at, node, meta
		FROM shared_templates ORDER BY built_at DESC, id`)
	if err != nil {
		return nil, fmt.Errorf("listing shared templates: %w", err)
	}
	defer rows.Close()
	var out []SharedTemplate
	for rows.Next() {
		t, err := scanSharedTemplate(rows.Scan)
		if err != nil {
			return nil, err
		}
		out = append(out, *t)
	}
	return out, rows.Err()
}

// DeleteSharedTemplate removes template id's record; none is not an error.
func (s *Store) DeleteSharedTemplate(ctx context.Context, id string) error {
	if _, err := s.shared.ExecContext(ctx, `DELETE FROM shared_templates WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting shared template %s: %w", id, err)
	}
	return nil
}

func scanSharedTemplate(scan func(...any) error) (*SharedTemplate, error) {
	var t SharedTemplate
	var public, builtAt int64
	var meta string
	if err := scan(&t.ID, &t.Alias, &t.Team, &public, &t.BuildID, &t.Digest, &builtAt, &t.Node, &meta); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, err
		}
		return nil, fmt.Errorf("reading shared template: %w", err)
	}
	t.Public, t.BuiltAt, t.Meta = public != 0, time.Unix(0, builtAt).UTC(), []byte(meta)
	return &t, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
