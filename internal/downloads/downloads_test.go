package downloads

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/store"
)

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func openDB(t *testing.T) *store.Store {
	t.Helper()
	db, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

const sum = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func TestRecordAndList(t *testing.T) {
	db := openDB(t)
	ctx := t.Context()
	now := t0
	l, err := Open(ctx, db, Options{Now: func() time.Time { return now }, MaxPerSandbox: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.List(ctx, "sbx1"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("List of a sandbox never known = %v, want ErrNotFound", err)
	}
	// A sandbox record without downloads lists empty.
	if err := db.Insert(ctx, &store.Sandbox{ID: "sbx2", Template: "base", CreatedAt: t0, EndAt: t0}); err != nil {
		t.Fatal(err)
	}
	if got, err := l.List(ctx, "sbx2"); err != nil || len(got) != 0 || got == nil {
		t.Errorf("List(sbx2) = %v, %v; want an empty list", got, err)
	}
	for i := range 5 {
		if err := l.RecordDownload(ctx, gateway.Download{SandboxID: "sbx1", Time: t0.Add(time.Duration(i) * time.Second),
			Ecosystem: "pypi", Name: "requests", Version: fmt.Sprint("2.", i), URL: "https://files.example/r.whl",
			Size: int64(100 + i), SHA256: strings.ToUpper(sum)}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := l.List(ctx, "sbx1")
	if err != nil {
		t.Fatal(err)
	}
	// The newest 3 kept, oldest first.
	if len(got) != 3 || got[0].Version != "2.2" || got[2].Version != "2.4" || got[2].Size != 104 ||
		got[2].SHA256 != sum || !got[2].Time.Equal(t0.Add(4*time.Second)) || got[0].Ecosystem != "pypi" {
		t.Errorf("List(sbx1) = %+v", got)
	}
	// Other sandboxes' records count against their own budget only.
	if err := l.RecordDownload(ctx, gateway.Download{SandboxID: "sbx2", Ecosystem: "npm", Name: "left-pad"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.List(ctx, "sbx1"); len(got) != 3 {
		t.Errorf("sbx1 has %d records after sbx2 recorded, want 3", len(got))
	}
	if got, _ := l.List(ctx, "sbx2"); len(got) != 1 || !got[0].Time.Equal(now) {
		t.Errorf("List(sbx2) = %+v (a zero time takes now)", got)
	}
}

// What the gateway reports comes from a sandbox's requests: bounded and
// cleaned.
func TestFieldsBounded(t *testing.T) {
	db := openDB(t)
	ctx := t.Context()
	l, err := Open(ctx, db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := gateway.Download{SandboxID: "s", Ecosystem: strings.Repeat("é", 1000), Name: "bad\xffutf8\x1b[2J\u009b",
		URL: "https://x/" + strings.Repeat("a", 10_000), Size: -5, SHA256: "not-hex"}
	if err := l.RecordDownload(ctx, d); err != nil {
		t.Fatal(err)
	}
	got, _ := l.List(ctx, "s")
	if len(got) != 1 {
		t.Fatalf("List = %+v", got)
	}
	g := got[0]
	if len(g.Ecosystem) > maxField || len(g.URL) > maxURL || g.Size != 0 || g.SHA256 != "" || g.Name != "bad\uFFFDutf8\uFFFD[2J\uFFFD" ||
		!strings.HasPrefix(g.URL, "https://x/aaa") || strings.ContainsRune(g.Ecosystem, '\uFFFD') {
		t.Errorf("stored %q %d %q %d %q", g.Ecosystem, len(g.URL), g.Name, g.Size, g.SHA256)
	}
	if err := l.RecordDownload(ctx, gateway.Download{}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("RecordDownload without a sandbox = %v", err)
	}
}

// Records outlive the sandbox record and expire after Retention.
func TestRetention(t *testing.T) {
	db := openDB(t)
	ctx := t.Context()
	now := t0
	clock := func() time.Time { return now }
	l, err := Open(ctx, db, Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Insert(ctx, &store.Sandbox{ID: "old", Template: "base", State: store.StateKilled, CreatedAt: t0, EndAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := l.RecordDownload(ctx, gateway.Download{SandboxID: "old", Name: "a", Time: t0}); err != nil {
		t.Fatal(err)
	}
	// The sandbox record is pruned (as the manager does with killed
	// ones): the downloads stay, and the sandbox is still known.
	if _, err := db.DeleteKilledBefore(ctx, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, err := l.List(ctx, "old"); err != nil || len(got) != 1 {
		t.Errorf("List after the sandbox record went = %+v, %v", got, err)
	}
	// Past retention, the next start (Open) removes them.
	now = t0.Add(Retention + time.Minute)
	if _, err := Open(ctx, db, Options{Now: clock}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.List(ctx, "old"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("List past retention = %v, want ErrNotFound", err)
	}
	// And a running daemon prunes as records arrive, at most hourly.
	if err := l.RecordDownload(ctx, gateway.Download{SandboxID: "b", Name: "b", Time: now}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(Retention + 2*time.Hour)
	if err := l.RecordDownload(ctx, gateway.Download{SandboxID: "c", Name: "c", Time: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.List(ctx, "b"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("List(b) past retention while running = %v, want ErrNotFound", err)
	}
}

// The real budget holds: 10,000 newest of a sandbox. Measured and logged.
func TestRealBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("inserts 10,050 records")
	}
	db := openDB(t)
	ctx := t.Context()
	l, err := Open(ctx, db, Options{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range MaxPerSandbox + 50 {
		if err := l.RecordDownload(ctx, gateway.Download{SandboxID: "s", Name: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d records in %v", MaxPerSandbox+50, time.Since(start))
	got, err := l.List(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != MaxPerSandbox || got[0].Name != "50" {
		t.Errorf("kept %d records from %q, want %d from 50", len(got), got[0].Name, MaxPerSandbox)
	}
}
