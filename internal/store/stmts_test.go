package store

import (
	"path/filepath"
	"testing"
	"time"
)

// TestStatementsPreparedOnce: a sandbox's record written and marked
// killed again and again prepares each of the two statements once, and
// what they wrote reads back.
func TestStatementsPreparedOnce(t *testing.T) {
	s, err := Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := s.db.prepares.Load()
	now := time.Now()
	const n = 20
	for i := range n {
		id := "stmt" + string(rune('a'+i))
		if err := s.Insert(t.Context(), &Sandbox{ID: id, Template: "base", CreatedAt: now, EndAt: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetState(t.Context(), id, StateKilled); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.db.prepares.Load() - before; got != 2 {
		t.Errorf("%d records inserted and killed prepared %d statements, want 2 (each once)", n, got)
	}
	for i := range n {
		id := "stmt" + string(rune('a'+i))
		rec, err := s.Get(t.Context(), id)
		if err != nil || rec.State != StateKilled || rec.Template != "base" {
			t.Errorf("Get(%s) = %+v, %v; want base, killed", id, rec, err)
		}
	}
}

// BenchmarkSandboxRecord is the store's part of a create and a kill: a
// record inserted, then marked killed.
func BenchmarkSandboxRecord(b *testing.B) {
	s, err := Open(b.Context(), filepath.Join(b.TempDir(), "fence.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	i := 0
	for b.Loop() {
		i++
		id := "bench" + time.Duration(i).String()
		if err := s.Insert(b.Context(), &Sandbox{ID: id, Template: "base", CreatedAt: now, EndAt: now.Add(time.Minute)}); err != nil {
			b.Fatal(err)
		}
		if err := s.SetState(b.Context(), id, StateKilled); err != nil {
			b.Fatal(err)
		}
	}
}
