package store

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

func TestVolumes(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := &Volume{ID: "v1", Team: "team-a", Name: "data", SizeBytes: 8 << 20, CreatedAt: time.Unix(10, 0)}
	if err := s.InsertVolume(ctx, a); err != nil {
		t.Fatal(err)
	}
	dup := *a
	dup.ID = "v2"
	if err := s.InsertVolume(ctx, &dup); !errors.Is(err, ErrVolumeExists) {
		t.Errorf("a name taken in its team: %v, want ErrVolumeExists", err)
	}
	other := Volume{ID: "v3", Team: "team-b", Name: "data", SizeBytes: 8 << 20, CreatedAt: time.Unix(11, 0)}
	if err := s.InsertVolume(ctx, &other); err != nil {
		t.Errorf("the same name in another team: %v", err)
	}
	if got, err := s.Volumes(ctx, "team-a"); err != nil || len(got) != 1 || got[0] != *a {
		t.Errorf("Volumes(team-a) = %+v, %v", got, err)
	}
	if got, err := s.Volumes(ctx, ""); err != nil || len(got) != 2 {
		t.Errorf("Volumes(all) = %+v, %v", got, err)
	}
	if _, err := s.VolumeByID(ctx, "team-b", "v1"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("another team's volume by ID: %v, want not found", err)
	}
	if v, err := s.VolumeByName(ctx, "team-b", "data"); err != nil || v.ID != "v3" {
		t.Errorf("VolumeByName(team-b, data) = %+v, %v", v, err)
	}

	// Users: the running and paused sandboxes that mount it.
	for id, st := range map[string]State{"sb-run": StateRunning, "sb-paused": StatePaused, "sb-dead": StateKilled} {
		if err := s.Insert(ctx, &Sandbox{ID: id, Template: "minimal", State: StateRunning, CreatedAt: time.Unix(1, 0), EndAt: time.Unix(2, 0), Team: "team-a"}); err != nil {
			t.Fatal(err)
		}
		if st != StateRunning {
			if err := s.SetState(ctx, id, st); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.InsertVolumeMounts(ctx, id, []VolumeMount{{VolumeID: "v1", Path: "/data"}}); err != nil {
			t.Fatal(err)
		}
	}
	if users, err := s.VolumeUsers(ctx, "v1"); err != nil || !slices.Equal(users, []string{"sb-paused", "sb-run"}) {
		t.Errorf("VolumeUsers(v1) = %v, %v; want sb-paused, sb-run", users, err)
	}
	if ms, err := s.VolumeMountsOf(ctx, "sb-run", "sb-none"); err != nil || len(ms) != 1 || ms[0] != (VolumeMount{SandboxID: "sb-run", VolumeID: "v1", Name: "data", Path: "/data"}) {
		t.Errorf("VolumeMountsOf(sb-run) = %+v, %v", ms, err)
	}
	if err := s.DeleteVolume(ctx, "team-b", "v1"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("deleting another team's volume: %v", err)
	}
	if err := s.DeleteVolume(ctx, "team-a", "v1"); err != nil {
		t.Fatal(err)
	}
	if ms, err := s.VolumeMountsOf(ctx, "sb-run"); err != nil || len(ms) != 0 {
		t.Errorf("mounts of a deleted volume: %+v, %v", ms, err)
	}
	if err := s.InsertVolume(ctx, &dup); err != nil {
		t.Errorf("the name of a deleted volume: %v", err)
	}
}
