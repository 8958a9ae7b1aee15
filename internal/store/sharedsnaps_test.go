package store

import (
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestSharedSnapshots records, finds, lists, replaces by name and deletes
// shared snapshots, each team's apart.
func TestSharedSnapshots(t *testing.T) {
	s, _ := openTest(t)
	a := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-a", KeyID: "ka"})
	b := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-b", KeyID: "kb"})
	mk := func(id, name, layer string, at time.Time) *SharedSnapshot {
		return &SharedSnapshot{Snapshot: Snapshot{ID: id, Name: name, Tag: "default", Layer: layer, SandboxID: "sb1",
			Template: "base", CreatedAt: at, Spec: `{"cpus":1}`, Bytes: 10},
			Backend: "native", Node: "node-a", Digest: "sha256:" + layer,
			Chain: []LayerRef{{Layer: layer, Digest: "sha256:" + layer}, {Layer: "parent", Digest: "sha256:parent"}}}
	}
	if _, err := s.PutSharedSnapshot(a, mk("s1", "", "l1", t0)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSharedSnapshot(a, mk("s2", "named", "l2", t0.Add(time.Second))); err != nil {
		t.Fatal(err)
	}
	bad := mk("s3", "", "l3", t0)
	bad.Digest = "sha256:other"
	if _, err := s.PutSharedSnapshot(a, bad); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("PutSharedSnapshot(chain not starting with its digest) = %v, want ErrInvalidArgument", err)
	}
	got, err := s.FindSharedSnapshot(a, "named:v2")
	if err != nil || got.ID != "s2" || got.Team != "team-a" || got.Node != "node-a" || len(got.Chain) != 2 ||
		got.Chain[1].Layer != "parent" || got.Spec != `{"cpus":1}` || !got.CreatedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("FindSharedSnapshot(named) = %+v, %v", got, err)
	}
	if _, err := s.FindSharedSnapshot(b, "s1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("FindSharedSnapshot(other team's) = %v, want ErrNotFound", err)
	}
	// The same name in another team is another snapshot.
	if _, err := s.PutSharedSnapshot(b, mk("s4", "named", "l4", t0)); err != nil {
		t.Fatalf("PutSharedSnapshot(team b, same name) = %v", err)
	}
	// A new build of a name keeps its ID and replaces its layers.
	replaced, err := s.PutSharedSnapshot(a, mk("s5", "named", "l5", t0.Add(2*time.Second)))
	if err != nil || replaced != "l2" {
		t.Fatalf("PutSharedSnapshot(again) = %q, %v; want l2", replaced, err)
	}
	list, err := s.ListSharedSnapshots(a, "", "")
	if err != nil || len(list) != 2 || list[0].ID != "s2" || list[0].Layer != "l5" || list[1].ID != "s1" {
		t.Fatalf("ListSharedSnapshots(a) = %+v, %v", list, err)
	}
	if all, err := s.ListSharedSnapshots(t.Context(), "", ""); err != nil || len(all) != 3 {
		t.Fatalf("ListSharedSnapshots(daemon) = %d, %v; want 3", len(all), err)
	}
	if k, err := s.SharedSnapshotUsage(t.Context(), "team-a", "named"); err != nil || k.Count != 1 || k.Bytes != 10 {
		t.Fatalf("SharedSnapshotUsage(team-a except named) = %+v, %v", k, err)
	}
	if err := s.DeleteSharedSnapshot(b, "s1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("DeleteSharedSnapshot(other team's) = %v, want ErrNotFound", err)
	}
	if err := s.DeleteSharedSnapshot(a, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FindSharedSnapshot(a, "s1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("FindSharedSnapshot(deleted) = %v", err)
	}
}
