package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var (
	// onPostgres makes openTest put the shared records in PostgreSQL.
	onPostgres atomic.Bool
	// dsns maps a store's file path to its PostgreSQL URL.
	dsns sync.Map
)

// sharedContract are the tests of the records every node shares: each
// runs again under TestPostgres with those records in PostgreSQL.
var sharedContract = []struct {
	name string
	f    func(*testing.T)
}{
	{"Teams", TestTeams},
	{"MintAuthenticateRevoke", TestMintAuthenticateRevoke},
	{"MintBadInput", TestMintBadInput},
	{"OwnersConfine", TestOwnersConfine},
	{"InsertSecretCap", TestInsertSecretCap},
	{"TeamLimitsPersist", TestTeamLimitsPersist},
	{"SSHKeys", TestSSHKeys},
	{"ReserveAcrossNodes", TestReserveAcrossNodes},
	{"ReservationLease", TestReservationLease},
	{"TeamRecords", TestTeamRecords},
	{"SharedTemplates", TestSharedTemplates},
	{"SharedSnapshots", TestSharedSnapshots},
	{"MovedSandboxes", TestMovedSandboxes},
}

// TestPostgres runs the shared records' tests with those records in a
// real PostgreSQL server.
func TestPostgres(t *testing.T) {
	pgtest.Start(t)
	onPostgres.Store(true)
	defer onPostgres.Store(false)
	for _, c := range sharedContract {
		t.Run(c.name, c.f)
	}
}

// TestPostgresTwoNodes opens two stores ("nodes", each with its own file)
// on one new PostgreSQL database at once, many times over: both migrate
// it at the same moment and both start; what one writes the other reads;
// each keeps its sandboxes to itself.
func TestPostgresTwoNodes(t *testing.T) {
	srv := pgtest.Start(t)
	for round := range 5 {
		dsn := srv.Database(t)
		var nodes [2]*Store
		var wg sync.WaitGroup
		errs := make([]error, len(nodes))
		for i := range nodes {
			wg.Go(func() {
				nodes[i], errs[i] = OpenWith(t.Context(), Options{Path: filepath.Join(t.TempDir(), "fence.db"), DatabaseURL: dsn})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: node %d: OpenWith = %v", round, i, err)
			}
			defer nodes[i].Close()
		}
		var applied int
		if err := nodes[0].shared.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM schema_migrations`).Scan(&applied); err != nil || applied != len(migrations) {
			t.Fatalf("round %d: %d migrations recorded, %v; want %d, once each", round, applied, err, len(migrations))
		}
	}

	a, _ := openTwo(t)
	ctx := t.Context()
	tm, err := a[0].CreateTeam(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := a[0].MintAPIKey(ctx, tm.ID, "ci")
	if err != nil {
		t.Fatal(err)
	}
	c, err := a[1].Authenticate(ctx, KindAPIKey, key)
	if err != nil || c.Team != tm.ID {
		t.Fatalf("node 2 authenticating node 1's key = %+v, %v", c, err)
	}
	if err := a[1].RevokeCredential(ctx, tm.ID, KindAPIKey, c.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := a[0].Authenticate(ctx, KindAPIKey, key); !errors.Is(err, ErrCredentialInvalid) {
		t.Fatalf("node 1 authenticating a key node 2 revoked = %v", err)
	}
	if err := a[0].SetTeamLimits(ctx, tm.ID, tenancy.Limits{ConcurrentSandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	if l, err := a[1].TeamLimits(ctx); err != nil || l[tm.ID].ConcurrentSandboxes != 3 {
		t.Fatalf("node 2's limits = %v, %v", l, err)
	}
	// A team's egress of the day and the names approved for it are the
	// cluster's: what one node adds the other reads.
	if err := a[0].AddTeamEgress(ctx, tm.ID, 20000, 42); err != nil {
		t.Fatal(err)
	}
	if e, err := a[1].TeamEgress(ctx, 20000); err != nil || e[tm.ID] != 42 {
		t.Fatalf("node 2's egress of node 1's team = %v, %v", e, err)
	}
	if err := a[1].AddTeamName(ctx, tm.ID, "api.example.com", "test"); err != nil {
		t.Fatal(err)
	}
	if n, err := a[0].TeamNames(ctx); err != nil || len(n[tm.ID]) != 1 {
		t.Fatalf("node 1's names approved on node 2 = %v, %v", n, err)
	}
	now := time.Now()
	if err := a[0].Insert(ctx, &Sandbox{ID: "sb1", Template: "base", CreatedAt: now, EndAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if l, err := a[1].List(ctx, Filter{}); err != nil || len(l) != 0 {
		t.Fatalf("node 2 lists node 1's sandboxes: %d, %v", len(l), err)
	}
}

// openTwo opens two stores ("nodes") on one new PostgreSQL database.
func openTwo(t *testing.T) ([2]*Store, string) {
	t.Helper()
	dsn := pgtest.Database(t)
	var nodes [2]*Store
	for i := range nodes {
		s, err := OpenWith(t.Context(), Options{Path: filepath.Join(t.TempDir(), "fence.db"), DatabaseURL: dsn})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		nodes[i] = s
	}
	return nodes, dsn
}

// TestPostgresUnreachable checks that a database nobody answers at is a
// clear error, soon, naming it without its password.
func TestPostgresUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := OpenWith(ctx, Options{Path: filepath.Join(t.TempDir(), "fence.db"),
		DatabaseURL: "postgres://fence:hunter2@127.0.0.1:1/fence?sslmode=disable", ConnectTimeout: 5 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "reaching the database postgres://fence@127.0.0.1:1/fence") || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("OpenWith(unreachable) = %v", err)
	}
	_, err = OpenWith(ctx, Options{Path: filepath.Join(t.TempDir(), "fence.db"), DatabaseURL: "postgres://%zz"})
	if err == nil {
		t.Fatal("OpenWith(bad URL) = nil")
	}
}

func TestRebind(t *testing.T) {
	for in, want := range map[string]string{
		`SELECT a FROM t WHERE b = ? AND c = 'x?' AND d = ?`: `SELECT a FROM t WHERE b = $1 AND c = 'x?' AND d = $2`,
		"INSERT INTO t VALUES (?, ?) -- why?\n; SELECT ?":    "INSERT INTO t VALUES ($1, $2) -- why?\n; SELECT $3",
		`SELECT "q?" FROM t WHERE x = 'it''s' AND y = ?`:     `SELECT "q?" FROM t WHERE x = 'it''s' AND y = $1`,
	} {
		if got := rebind(in); got != want {
			t.Errorf("rebind(%q) = %q, want %q", in, got, want)
		}
	}
	if got := pgDDL("a INTEGER PRIMARY KEY AUTOINCREMENT, b INTEGER, c BLOB, d REAL, e INTEGERS"); got !=
		"a BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, b BIGINT, c BYTEA, d DOUBLE PRECISION, e INTEGERS" {
		t.Errorf("pgDDL = %q", got)
	}
}

// TestPostgresSecretCapAcrossNodes checks that the secrets' capacity
// holds when two nodes insert at once.
func TestPostgresSecretCapAcrossNodes(t *testing.T) {
	nodes, _ := openTwo(t)
	ctx := t.Context()
	for _, n := range nodes {
		n.shared.sql.SetMaxIdleConns(40)
	}
	for round := range 10 {
		var wg sync.WaitGroup
		var ok atomic.Int64
		for i := range 40 {
			wg.Go(func() {
				now := time.Now()
				err := nodes[i%2].InsertSecret(ctx, &Secret{ID: fmt.Sprint("sec_", round, "_", i), Name: fmt.Sprint("n", round, "_", i),
					Version: 1, Sealed: []byte{1}, CreatedAt: now, UpdatedAt: now}, 5)
				switch {
				case err == nil:
					ok.Add(1)
				case !errors.Is(err, api.ErrConflict):
					t.Errorf("InsertSecret = %v", err)
				}
			})
		}
		wg.Wait()
		if n, err := nodes[0].CountSecrets(ctx); n != 5 || ok.Load() != 5 {
			t.Fatalf("round %d: %d stored (%v), %d inserts succeeded; want 5", round, n, err, ok.Load())
		}
		if _, err := nodes[0].shared.ExecContext(ctx, `DELETE FROM secrets`); err != nil {
			t.Fatal(err)
		}
	}
}
