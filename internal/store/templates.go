package store

import (
	"context"
	"fmt"
)

// Doc is one record kept as an opaque JSON document, for the template
// builds (internal/tbuild owns the documents' shape).
type Doc struct {
	ID     string
	Key    string // the alias of a template, the template ID of a build
	Status string // builds only
	JSON   []byte
}

// PutTemplateDoc inserts or replaces a built template's record.
func (s *Store) PutTemplateDoc(ctx context.Context, d Doc) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO built_templates (id, alias, doc) VALUES (?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET alias = excluded.alias, doc = excluded.doc`, d.ID, d.Key, string(d.JSON)); err != nil {
		return fmt.Errorf("recording template %s: %w", d.ID, err)
	}
	return nil
}

// PutBuildDoc inserts or replaces a template build's record.
func (s *Store) PutBuildDoc(ctx context.Context, d Doc) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO template_builds (id, template_id, status, doc) VALUES (?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET template_id = excluded.template_id, status = excluded.status, doc = excluded.doc`,
		d.ID, d.Key, d.Status, string(d.JSON)); err != nil {
		return fmt.Errorf("recording build %s: %w", d.ID, err)
	}
	return nil
}

// DeleteTemplateDoc removes a built template's record and its builds'.
func (s *Store) DeleteTemplateDoc(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("deleting template %s: %w", id, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM template_builds WHERE template_id = ?`, id); err != nil {
		return fmt.Errorf("deleting template %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM built_templates WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting template %s: %w", id, err)
	}
	return tx.Commit()
}

// TemplateDocs returns every built template's record.
func (s *Store) TemplateDocs(ctx context.Context) ([]Doc, error) {
	return s.docs(ctx, `SELECT id, alias, '', doc FROM built_templates ORDER BY id`)
}

// BuildDocs returns every template build's record.
func (s *Store) BuildDocs(ctx context.Context) ([]Doc, error) {
	return s.docs(ctx, `SELECT id, template_id, status, doc FROM template_builds ORDER BY id`)
}

func (s *Store) docs(ctx context.Context, q string) ([]Doc, error) {
	rows, err := s.db.QueryContext(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("reading template records: %w", err)
	}
	defer rows.Close()
	var out []Doc
	for rows.Next() {
		var d Doc
		var doc string
		if err := rows.Scan(&d.ID, &d.Key, &d.Status, &doc); err != nil {
			return nil, fmt.Errorf("reading template records: %w", err)
		}
		d.JSON = []byte(doc)
		out = append(out, d)
	}
	return out, rows.Err()
}
