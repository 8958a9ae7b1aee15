package store

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// BenchmarkStore measures the shared records' operations on each engine:
// minting an API key, authenticating one, and reserving (then releasing)
// a team's quota for a sandbox.
func BenchmarkStore(b *testing.B) {
	for _, engine := range []string{"sqlite", "postgres"} {
		open := func(b *testing.B) *Store {
			o := Options{Path: filepath.Join(b.TempDir(), "fence.db")}
			if engine == "postgres" {
				o.DatabaseURL = pgtest.Database(b)
			}
			s, err := OpenWith(b.Context(), o)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}
		b.Run(engine+"/CreateKey", func(b *testing.B) {
			s := open(b)
			for b.Loop() {
				if _, _, err := s.MintAPIKey(b.Context(), tenancy.DefaultTeamID, "k"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(engine+"/CheckKey", func(b *testing.B) {
			s := open(b)
			for i := range 1000 {
				if _, _, err := s.MintAPIKey(b.Context(), tenancy.DefaultTeamID, fmt.Sprint("k", i)); err != nil {
					b.Fatal(err)
				}
			}
			key, _, err := s.MintAPIKey(b.Context(), tenancy.DefaultTeamID, "bench")
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := s.Authenticate(b.Context(), KindAPIKey, key); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(engine+"/ReserveQuota", func(b *testing.B) {
			s := open(b)
			l := tenancy.Limits{ConcurrentSandboxes: 1000}
			for i := range 20 { // a team with sandboxes already
				if err := s.Reserve(b.Context(), Reservation{ID: fmt.Sprint("r", i), Team: "t", Node: "n", CPUs: 1,
					Expires: time.Now().Add(time.Hour)}, l); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				if err := s.Reserve(b.Context(), Reservation{ID: "x", Team: "t", Node: "n", CPUs: 1,
					Expires: time.Now().Add(time.Hour)}, l); err != nil {
					b.Fatal(err)
				}
				if err := s.ReleaseReservation(b.Context(), "x"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
