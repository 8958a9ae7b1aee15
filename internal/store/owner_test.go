package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestOwnersConfine checks that a principal's context sees its own team's
// sandboxes, secrets and snapshots and none of another team's, which
// answer as missing ones; the daemon's context sees every team's.
func TestOwnersConfine(t *testing.T) {
	s, _ := openTest(t)
	a := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-a", KeyID: "ka"})
	b := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-b", KeyID: "kb"})
	now := time.Now()
	if err := s.Insert(a, &Sandbox{ID: "sa", Template: "base", CreatedAt: now, EndAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(a, "sa"); err != nil || got.Team != "team-a" {
		t.Fatalf("Get(own) = %+v, %v", got, err)
	}
	if _, err := s.Get(b, "sa"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(other team's) = %v, want ErrNotFound", err)
	}
	if l, err := s.List(b, Filter{}); err != nil || len(l) != 0 {
		t.Fatalf("List(other team) = %d records, %v", len(l), err)
	}
	if l, err := s.List(context.Background(), Filter{}); err != nil || len(l) != 1 {
		t.Fatalf("List(daemon) = %d records, %v", len(l), err)
	}

	for _, ctx := range []context.Context{a, b} {
		if err := s.InsertSecret(ctx, &Secret{ID: "sec-" + tenancy.TeamOf(ctx), Name: "TOKEN", Sealed: []byte{1}, CreatedAt: now, UpdatedAt: now}, 0); err != nil {
			t.Fatalf("InsertSecret(%s, TOKEN) = %v: names are per team", tenancy.TeamOf(ctx), err)
		}
	}
	if sec, err := s.SecretByName(b, "TOKEN"); err != nil || sec.ID != "sec-team-b" {
		t.Fatalf("SecretByName(b) = %+v, %v", sec, err)
	}
	if _, err := s.SecretByID(b, "sec-team-a"); !errors.Is(err, ErrSecretNotFound) {
		t.Fatalf("SecretByID(other team's) = %v", err)
	}
	if err := s.UpdateSecret(b, "sec-team-a", 0, []byte{2}, nil, now); !errors.Is(err, ErrSecretNotFound) {
		t.Fatalf("UpdateSecret(other team's) = %v", err)
	}
	if err := s.DeleteSecret(b, "sec-team-a"); !errors.Is(err, ErrSecretNotFound) {
		t.Fatalf("DeleteSecret(other team's) = %v", err)
	}
	if l, err := s.ListSecrets(b, nil, 0); err != nil || len(l) != 1 || l[0].ID != "sec-team-b" {
		t.Fatalf("ListSecrets(b) = %v, %v", l, err)
	}
	if sec, err := s.SecretByID(a, "sec-team-a"); err != nil || sec.Version != 0 {
		t.Fatalf("secret of a after b's attempts = %+v, %v", sec, err)
	}

	if _, err := s.PutSnapshot(a, &Snapshot{ID: "snap-a", Name: "img", Tag: "default", Layer: "la", SandboxID: "sa", Template: "base", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	// b's snapshot of the same name is its own, and replaces nothing of a's.
	if rep, err := s.PutSnapshot(b, &Snapshot{ID: "snap-b", Name: "img", Tag: "default", Layer: "lb", SandboxID: "sb", Template: "base", CreatedAt: now}); err != nil || rep != "" {
		t.Fatalf("PutSnapshot(b, img) = %q, %v", rep, err)
	}
	if sn, err := s.FindSnapshot(a, "img"); err != nil || sn.ID != "snap-a" || sn.Layer != "la" {
		t.Fatalf("FindSnapshot(a, img) = %+v, %v", sn, err)
	}
	if _, err := s.FindSnapshot(b, "snap-a"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("FindSnapshot(other team's) = %v", err)
	}
	if err := s.DeleteSnapshot(b, "snap-a"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("DeleteSnapshot(other team's) = %v", err)
	}
	if l, err := s.ListSnapshots(b, "", ""); err != nil || len(l) != 1 || l[0].ID != "snap-b" {
		t.Fatalf("ListSnapshots(b) = %v, %v", l, err)
	}
}
