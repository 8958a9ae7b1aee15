package store

import (
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

func TestSharedTemplates(t *testing.T) {
	ctx := t.Context()
	s, path := openTest(t)
	a := &SharedTemplate{ID: "tid-a", Alias: "py", Team: "team-1", BuildID: "b1", Digest: "sha256:aa",
		BuiltAt: time.Unix(10, 5).UTC(), Node: "node-a", Meta: []byte(`{"x":1}`)}
	b := &SharedTemplate{ID: "tid-b", Alias: "node", Team: "team-2", Public: true, BuildID: "b2", Digest: "sha256:bb",
		BuiltAt: time.Unix(20, 0).UTC(), Node: "node-b", Meta: []byte(`{}`)}
	for _, r := range []*SharedTemplate{a, b} {
		if err := s.PutSharedTemplate(ctx, r); err != nil {
			t.Fatalf("PutSharedTemplate(%s) = %v", r.ID, err)
		}
	}
	// An alias is one template's in the cluster.
	dup := *a
	dup.ID = "tid-c"
	if err := s.PutSharedTemplate(ctx, &dup); !errors.Is(err, api.ErrConflict) {
		t.Errorf("a second template named py: %v, want ErrConflict", err)
	}
	for _, key := range []string{"tid-a", "py"} {
		got, err := s.SharedTemplate(ctx, key)
		if err != nil || got.ID != "tid-a" || got.Digest != "sha256:aa" || got.Team != "team-1" || got.Public ||
			!got.BuiltAt.Equal(a.BuiltAt) || string(got.Meta) != `{"x":1}` || got.Node != "node-a" || got.BuildID != "b1" {
			t.Errorf("SharedTemplate(%s) = %+v, %v", key, got, err)
		}
	}
	if _, err := s.SharedTemplate(ctx, "none"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SharedTemplate(none) = %v, want ErrNotFound", err)
	}
	// A newer build replaces the record.
	a2 := *a
	a2.BuildID, a2.Digest, a2.BuiltAt = "b3", "sha256:cc", time.Unix(30, 0).UTC()
	if err := s.PutSharedTemplate(ctx, &a2); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSharedTemplatePublic(ctx, "tid-a", true); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSharedTemplatePublic(ctx, "none", true); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SetSharedTemplatePublic(none) = %v, want ErrNotFound", err)
	}
	// Another node (the same databases, opened again) reads alike.
	other := reopen(t, path)
	defer other.Close()
	all, err := other.SharedTemplates(ctx)
	if err != nil || len(all) != 2 || all[0].ID != "tid-a" || all[0].Digest != "sha256:cc" || !all[0].Public || all[1].ID != "tid-b" {
		t.Fatalf("SharedTemplates = %+v, %v; want tid-a (newest, public, sha256:cc) then tid-b", all, err)
	}
	if err := other.DeleteSharedTemplate(ctx, "tid-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SharedTemplate(ctx, "py"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a deleted record is still found: %v", err)
	}
	if err := s.DeleteSharedTemplate(ctx, "tid-a"); err != nil {
		t.Errorf("deleting a missing record: %v", err)
	}
}
