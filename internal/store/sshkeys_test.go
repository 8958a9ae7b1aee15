package store

import (
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func TestSSHKeys(t *testing.T) {
	ctx := t.Context()
	s, _ := openTest(t)
	a := &SSHKey{ID: "k1", Team: tenancy.DefaultTeamID, Name: "a", PublicKey: "ssh-ed25519 AAAA1", Fingerprint: "SHA256:one", CreatedAt: time.Unix(1, 0)}
	b := &SSHKey{ID: "k2", Team: "other", Name: "b", PublicKey: "ssh-ed25519 AAAA2", Fingerprint: "SHA256:two", CreatedAt: time.Unix(2, 0)}
	for _, k := range []*SSHKey{a, b} {
		if err := s.InsertSSHKey(ctx, k); err != nil {
			t.Fatalf("InsertSSHKey(%s) = %v", k.ID, err)
		}
	}
	dup := *a
	dup.ID, dup.Team = "k3", "other"
	if err := s.InsertSSHKey(ctx, &dup); !errors.Is(err, api.ErrConflict) {
		t.Errorf("a fingerprint registered twice: %v, want ErrConflict", err)
	}
	got, err := s.ListSSHKeys(ctx, tenancy.DefaultTeamID)
	if err != nil || len(got) != 1 || got[0].ID != "k1" || got[0].Fingerprint != "SHA256:one" || !got[0].CreatedAt.Equal(a.CreatedAt) {
		t.Errorf("ListSSHKeys(default) = %+v, %v; want k1 alone", got, err)
	}
	if k, err := s.SSHKeyByFingerprint(ctx, "SHA256:two"); err != nil || k.ID != "k2" || k.Team != "other" {
		t.Errorf("SSHKeyByFingerprint(two) = %+v, %v", k, err)
	}
	if _, err := s.SSHKeyByFingerprint(ctx, "SHA256:none"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SSHKeyByFingerprint(none) = %v, want ErrNotFound", err)
	}
	// Another team's key is a missing one.
	if err := s.DeleteSSHKey(ctx, tenancy.DefaultTeamID, "k2"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("DeleteSSHKey(another team's) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteSSHKey(ctx, "other", "k2"); err != nil {
		t.Errorf("DeleteSSHKey = %v", err)
	}
	if _, err := s.SSHKeyByFingerprint(ctx, "SHA256:two"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a deleted key is still found: %v", err)
	}
}
