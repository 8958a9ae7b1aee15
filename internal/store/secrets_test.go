package store

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// A database of the first schema (sandboxes only) upgrades in place and
// keeps its records.
func TestMigrateFromFirstSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`,
		migrations[0],
		`INSERT INTO schema_migrations VALUES (1, 0)`,
		`INSERT INTO sandboxes (id, template, state, created_at, end_at, cpu, memory_mb, disk_mb) VALUES ('old1', 'base', 'killed', 1, 2, 1, 512, 1024)`,
	} {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	raw.Close()
	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if sb, err := s.Get(t.Context(), "old1"); err != nil || sb.State != StateKilled {
		t.Errorf("old record after migration = %+v, %v", sb, err)
	}
	if known, err := s.SandboxKnown(t.Context(), "old1"); err != nil || !known {
		t.Errorf("SandboxKnown(old1) = %v, %v", known, err)
	}
	if n, err := s.CountSecrets(t.Context()); err != nil || n != 0 {
		t.Errorf("CountSecrets after migration = %d, %v", n, err)
	}
}

// Concurrent inserts never overshoot the cap: the count and the insert are
// one statement.
func TestInsertSecretCap(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, full := 0, 0
	for i := range 20 {
		wg.Go(func() {
			err := s.InsertSecret(ctx, &Secret{ID: fmt.Sprint("sec_", i), Name: fmt.Sprint("n", i), Version: 1,
				Sealed: []byte{1}, CreatedAt: time.Now(), UpdatedAt: time.Now()}, 5)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, api.ErrConflict):
				full++
			default:
				t.Errorf("InsertSecret = %v", err)
			}
		})
	}
	wg.Wait()
	if n, _ := s.CountSecrets(ctx); n != 5 || ok != 5 || full != 15 {
		t.Errorf("%d stored, %d ok, %d refused; want 5, 5, 15", n, ok, full)
	}
	// A taken name is a conflict too, and changes nothing.
	list, err := s.ListSecrets(ctx, nil, 1)
	if err != nil || len(list) != 1 {
		t.Fatalf("ListSecrets = %v, %v", list, err)
	}
	err = s.InsertSecret(ctx, &Secret{ID: "sec_x", Name: list[0].Name, Version: 1, Sealed: []byte{1}}, 0)
	if !errors.Is(err, api.ErrConflict) {
		t.Errorf("InsertSecret(taken name) = %v", err)
	}
	if _, err := s.SecretByID(ctx, "sec_x"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("SecretByID(sec_x) = %v, want not found", err)
	}
}
