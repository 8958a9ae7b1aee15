package timetravel

import (
	"errors"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestSnapshotsOfTeams: a snapshot is its team's (listed, used and deleted
// by it alone, another team's answering as a missing one), and a layer
// collection run from a request of another team keeps its layer.
func TestSnapshotsOfTeams(t *testing.T) {
	e := newEnv(t)
	a := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-a", KeyID: "ka"})
	b := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-b", KeyID: "kb"})
	src, err := e.m.Create(a, sandbox.CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := e.k.CreateSnapshot(a, src.ID, "img")
	if err != nil {
		t.Fatal(err)
	}
	if l, err := e.k.ListSnapshots(b, "", ""); err != nil || len(l) != 0 {
		t.Errorf("ListSnapshots(team-b) = %v, %v; want none", l, err)
	}
	if _, err := e.k.Origin(b, "img"); err != nil {
		t.Errorf("Origin(team-b, img) = %v, want nil (no snapshot of team-b's: an ordinary template name)", err)
	}
	if o, _ := e.k.Origin(b, "img"); o != nil {
		t.Errorf("Origin(team-b, img) = %+v: team-b boots team-a's snapshot", o)
	}
	if err := e.m.Kill(a, src.ID); err != nil {
		t.Fatal(err)
	}
	sns, err := e.store.ListSnapshots(a, "", "")
	if err != nil || len(sns) != 1 {
		t.Fatalf("team-a's snapshots = %v, %v", sns, err)
	}
	if err := collect(b, e.k); err != nil {
		t.Fatal(err)
	}
	if !e.lb.has(sns[0].Layer) {
		t.Fatalf("a collection run for team-b deleted team-a's snapshot layer %s", sns[0].Layer)
	}
	if _, err := e.m.Create(a, sandbox.CreateRequest{TemplateID: snap.SnapshotID}); err != nil {
		t.Errorf("team-a's create from its snapshot = %v", err)
	}
	if _, err := e.m.Create(b, sandbox.CreateRequest{TemplateID: snap.SnapshotID}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("team-b's create from team-a's snapshot = %v, want not found", err)
	}
}
