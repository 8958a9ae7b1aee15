package store

import (
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestMovedSandboxes records a moved sandbox, finds it for its team only,
// lets one node take it over (the second is refused), takes it back after
// a failed take-over, and replaces it when it moves again.
func TestMovedSandboxes(t *testing.T) {
	s, _ := openTest(t)
	a := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-a", KeyID: "ka"})
	b := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-b", KeyID: "kb"})
	mv := &Moved{ID: "abcde0123456789abcde", FromNode: "node-a", Backend: "native", Template: "base", Layer: "l2",
		Chain:  []LayerRef{{Layer: "l2", Digest: "sha256:2"}, {Layer: "l1", Digest: "sha256:1"}},
		Record: Sandbox{ID: "abcde0123456789abcde", Template: "base", State: StatePaused, CreatedAt: t0, EndAt: t0.Add(time.Minute), MemoryMB: 512, Metadata: map[string]string{"k": "v"}},
		Cold:   []byte{1, 2, 3}, MovedAt: t0}
	if err := s.PutMoved(a, mv); err != nil {
		t.Fatal(err)
	}
	got, err := s.FindMoved(a, mv.ID)
	if err != nil || got.Team != "team-a" || got.Node != "" || len(got.Chain) != 2 || got.Record.Metadata["k"] != "v" ||
		got.Record.MemoryMB != 512 || string(got.Cold) != "\x01\x02\x03" || !got.MovedAt.Equal(t0) || !got.TakenAt.IsZero() {
		t.Fatalf("FindMoved = %+v, %v", got, err)
	}
	if _, err := s.FindMoved(b, mv.ID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("FindMoved(other team's) = %v, want ErrNotFound", err)
	}
	if _, err := s.TakeMoved(b, mv.ID, "node-b", t0); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("TakeMoved(other team's) = %v, want ErrNotFound", err)
	}
	if got, err := s.TakeMoved(a, mv.ID, "node-b", t0.Add(time.Second)); err != nil || got.Node != "node-b" {
		t.Fatalf("TakeMoved(node-b) = %+v, %v", got, err)
	}
	if _, err := s.TakeMoved(a, mv.ID, "node-c", t0); !errors.Is(err, api.ErrConflict) {
		t.Fatalf("TakeMoved(node-c) after node-b = %v, want ErrConflict", err)
	}
	if err := s.ReturnMoved(t.Context(), mv.ID, "node-c"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("ReturnMoved by a node that did not take it = %v", err)
	}
	if err := s.ReturnMoved(t.Context(), mv.ID, "node-b"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.TakeMoved(t.Context(), mv.ID, "node-c", t0); err != nil || got.Node != "node-c" {
		t.Fatalf("TakeMoved(node-c) after node-b returned it = %+v, %v", got, err)
	}
	mv.FromNode, mv.Layer = "node-c", "l3"
	mv.Chain = []LayerRef{{Layer: "l3", Digest: "sha256:3"}}
	if err := s.PutMoved(a, mv); err != nil {
		t.Fatal(err)
	}
	if got, err := s.FindMoved(a, mv.ID); err != nil || got.Node != "" || got.FromNode != "node-c" || got.Layer != "l3" {
		t.Fatalf("FindMoved after a second move = %+v, %v", got, err)
	}
	if _, err := s.TakeMoved(t.Context(), "nosuchsandbox0000000", "node-b", t0); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("TakeMoved(unknown) = %v, want ErrNotFound", err)
	}
}
