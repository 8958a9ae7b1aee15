package store

import (
	"errors"
	"testing"
	"time"
)

// TestPauseCold: the resume data of a filesystem-only pause is kept with
// the paused record, survives a reopen, and goes with the next
// transition and with the kill.
func TestPauseCold(t *testing.T) {
	ctx := t.Context()
	s, path := openTest(t)
	if err := s.Insert(ctx, rec("a", 0, nil)); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := s.PauseCold(ctx, "a", StatePaused, now, now, []byte("x")); !errors.Is(err, ErrNotFound) {
		t.Errorf("PauseCold from the wrong state = %v, want not found", err)
	}
	if got, err := s.ColdResume(ctx, "a"); !errors.Is(err, ErrNotFound) || got != nil {
		t.Errorf("ColdResume of a running record = %q, %v", got, err)
	}
	if err := s.PauseCold(ctx, "a", StateRunning, now, now, []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := s.Get(ctx, "a"); err != nil || r.State != StatePaused {
		t.Fatalf("after PauseCold: %+v, %v", r, err)
	}
	if got, err := s.ColdResume(ctx, "a"); err != nil || string(got) != "sealed" {
		t.Fatalf("ColdResume = %q, %v", got, err)
	}
	if err := s.Transition(ctx, "a", StatePaused, StateRunning, now, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Transition(ctx, "a", StateRunning, StatePaused, now, now); err != nil {
		t.Fatal(err)
	}
	if got, err := s.ColdResume(ctx, "a"); err != nil || got != nil {
		t.Errorf("ColdResume after a resume and a memory pause = %q, %v; want none", got, err)
	}
	if err := s.PauseCold(ctx, "a", StatePaused, now, now, []byte("again")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetState(ctx, "a", StateKilled); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE cold IS NOT NULL`).Scan(&n); err != nil || n != 0 {
		t.Errorf("resume data left after the kill: %d, %v", n, err)
	}
}
