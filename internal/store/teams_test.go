package store

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func TestHashCredential(t *testing.T) {
	a, b := HashCredential("e2b_00"), HashCredential("e2b_01")
	if a == b || !strings.HasPrefix(a, "$sha256$") || a != HashCredential("e2b_00") {
		t.Fatalf("HashCredential: %q, %q", a, b)
	}
	if strings.Contains(a, "e2b_00") {
		t.Fatalf("the hash %q shows the value", a)
	}
	for _, c := range []struct {
		k    Kind
		v    string
		want bool
	}{
		{KindAPIKey, "e2b_0af3", true},
		{KindAPIKey, "e2b_", false},
		{KindAPIKey, "e2b_0AF3", false},
		{KindAPIKey, "e2b_zz", false},
		{KindAPIKey, "sk_e2b_00", false},
		{KindAccessToken, "sk_e2b_00", true},
		{KindAccessToken, "e2b_00", false},
		{KindAPIKey, "e2b_" + strings.Repeat("0", 129), false},
	} {
		if got := WellFormed(c.k, c.v); got != c.want {
			t.Errorf("WellFormed(%s, %q) = %v, want %v", c.k, c.v, got, c.want)
		}
	}
}

func TestTeams(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	def, err := s.Team(ctx, tenancy.DefaultTeamID)
	if err != nil || def.Name != "default" {
		t.Fatalf("default team = %+v, %v", def, err)
	}
	tm, err := s.CreateTeam(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Team(ctx, tm.ID); err != nil || got.Name != "acme" {
		t.Fatalf("Team(%s) = %+v, %v", tm.ID, got, err)
	}
	for _, name := range []string{"", " ", strings.Repeat("n", 10<<10)} {
		if _, err := s.CreateTeam(ctx, name); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("CreateTeam(%d bytes) = %v, want invalid argument", len(name), err)
		}
	}
	if _, err := s.Team(ctx, "nope"); !errors.Is(err, ErrTeamNotFound) || !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Team(nope) = %v", err)
	}
	all, err := s.Teams(ctx)
	if err != nil || len(all) != 2 || all[0].ID != tenancy.DefaultTeamID || all[1].ID != tm.ID {
		t.Fatalf("Teams = %+v, %v", all, err)
	}
}

func TestMintAuthenticateRevoke(t *testing.T) {
	s, path := openTest(t)
	ctx := t.Context()
	tm, err := s.CreateTeam(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	key, c, err := s.MintAPIKey(ctx, tm.ID, "ci")
	if err != nil {
		t.Fatal(err)
	}
	if !WellFormed(KindAPIKey, key) || len(key) != len("e2b_")+64 || c.Team != tm.ID || c.Kind != KindAPIKey ||
		!strings.HasPrefix(key, "e2b_"+c.MaskPrefix) || !strings.HasSuffix(key, c.MaskSuffix) || c.ValueLength != 64 {
		t.Fatalf("MintAPIKey = %q, %+v", key, c)
	}
	tok, tc, err := s.Mint(ctx, tm.ID, KindAccessToken, "laptop", c.ID)
	if err != nil || !strings.HasPrefix(tok, "sk_e2b_") || tc.CreatedBy != c.ID {
		t.Fatalf("Mint(access token) = %q, %+v, %v", tok, tc, err)
	}

	// Only the hash is stored.
	var n int
	if err := s.shared.QueryRowContext(ctx, `SELECT COUNT(*) FROM credentials WHERE hash = ? OR hash = ?`, key, tok).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a raw value is in the table (%d, %v)", n, err)
	}
	raw, err := readFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(raw, key[4:]) || strings.Contains(raw, tok[7:]) {
		t.Fatal("a raw value is in the database file")
	}

	got, err := s.Authenticate(ctx, KindAPIKey, key)
	if err != nil || got.ID != c.ID || got.Principal() != (tenancy.Principal{Team: tm.ID, KeyID: c.ID}) {
		t.Fatalf("Authenticate(key) = %+v, %v", got, err)
	}
	if _, err := s.Authenticate(ctx, KindAccessToken, key); !errors.Is(err, ErrCredentialInvalid) {
		t.Errorf("a key authenticated as an access token: %v", err)
	}
	wrong := key[:len(key)-1] + "0"
	if wrong == key {
		wrong = key[:len(key)-1] + "1"
	}
	if _, err := s.Authenticate(ctx, KindAPIKey, wrong); !errors.Is(err, ErrCredentialInvalid) {
		t.Errorf("a wrong key authenticated: %v", err)
	}
	if got, err := s.Authenticate(ctx, KindAccessToken, tok); err != nil || got.ID != tc.ID {
		t.Fatalf("Authenticate(token) = %+v, %v", got, err)
	}

	// Another team sees none of it.
	if _, err := s.Credential(ctx, tenancy.DefaultTeamID, KindAPIKey, c.ID); !errors.Is(err, ErrCredentialNotFound) {
		t.Errorf("Credential from another team = %v", err)
	}
	if err := s.RevokeCredential(ctx, tenancy.DefaultTeamID, KindAPIKey, c.ID, time.Now()); !errors.Is(err, ErrCredentialNotFound) {
		t.Errorf("RevokeCredential from another team = %v", err)
	}
	if err := s.RenameCredential(ctx, tenancy.DefaultTeamID, KindAPIKey, c.ID, "x"); !errors.Is(err, ErrCredentialNotFound) {
		t.Errorf("RenameCredential from another team = %v", err)
	}
	if err := s.RenameCredential(ctx, tm.ID, KindAPIKey, c.ID, strings.Repeat("n", 10<<10)); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("RenameCredential(10 kB) = %v", err)
	}
	if got, _ := s.Credential(ctx, tm.ID, KindAPIKey, c.ID); got == nil || got.Name != "ci" {
		t.Fatalf("refused changes changed the key: %+v", got)
	}
	if err := s.RenameCredential(ctx, tm.ID, KindAPIKey, c.ID, "ci2"); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchCredential(ctx, c.ID, t0); err != nil {
		t.Fatal(err)
	}
	list, err := s.Credentials(ctx, tm.ID, KindAPIKey)
	if err != nil || len(list) != 1 || list[0].Name != "ci2" || !list[0].LastUsed.Equal(t0) {
		t.Fatalf("Credentials = %+v, %v", list, err)
	}

	if err := s.RevokeCredential(ctx, tm.ID, KindAPIKey, c.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, KindAPIKey, key); !errors.Is(err, ErrCredentialInvalid) || !errors.Is(err, api.ErrUnauthenticated) {
		t.Errorf("a revoked key authenticated: %v", err)
	}
	if err := s.RevokeCredential(ctx, tm.ID, KindAPIKey, c.ID, time.Now()); !errors.Is(err, ErrCredentialNotFound) {
		t.Errorf("revoking twice = %v", err)
	}
	if list, _ := s.Credentials(ctx, tm.ID, KindAPIKey); len(list) != 0 {
		t.Errorf("a revoked key is listed: %+v", list)
	}
}

func TestMintBadInput(t *testing.T) {
	s, _ := openTest(t)
	ctx := t.Context()
	if _, _, err := s.MintAPIKey(ctx, "00000000-0000-4000-8000-00000000ffff", "k"); !errors.Is(err, ErrTeamNotFound) {
		t.Errorf("MintAPIKey(unknown team) = %v", err)
	}
	if _, _, err := s.MintAPIKey(ctx, tenancy.DefaultTeamID, strings.Repeat("n", 10<<10)); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("MintAPIKey(10 kB name) = %v", err)
	}
	if _, _, err := s.Mint(ctx, tenancy.DefaultTeamID, "root", "k", ""); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Mint(kind root) = %v", err)
	}
	var n int
	if err := s.shared.QueryRowContext(ctx, `SELECT COUNT(*) FROM credentials`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("refused mints left %d credentials (%v)", n, err)
	}
}

// TestTeamsMigrationKeepsRecords upgrades a database of the schema before
// teams: its records stay, and the default team exists.
func TestTeamsMigrationKeepsRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fence.db")
	saved := migrations
	migrations = saved[:slices.Index(saved, migrationTeams)]
	s, err := Open(t.Context(), path)
	if err == nil {
		// The schema of then: no team column to write.
		_, err = s.db.ExecContext(t.Context(), `INSERT INTO sandboxes (id, template, state, created_at, end_at, cpu, memory_mb, disk_mb)
			VALUES ('old1', 'base', 'running', 1, 2, 1, 512, 1024)`)
		s.Close()
	}
	migrations = saved
	if err != nil {
		t.Fatal(err)
	}
	s, err = Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open after the upgrade = %v", err)
	}
	defer s.Close()
	if got, err := s.Get(t.Context(), "old1"); err != nil || got.Team != tenancy.DefaultTeamID {
		t.Errorf("Get(old1) after the upgrade = %+v, %v; want it the default team's", got, err)
	}
	if _, err := s.Team(t.Context(), tenancy.DefaultTeamID); err != nil {
		t.Errorf("the default team after the upgrade: %v", err)
	}
}

// readFile returns the database file and its write-ahead log as one string.
func readFile(path string) (string, error) {
	var out []byte
	for _, p := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		out = append(out, b...)
	}
	return string(out), nil
}

// BenchmarkAuthenticate is the cost every request with a team's key pays.
func BenchmarkAuthenticate(b *testing.B) {
	s, err := Open(b.Context(), filepath.Join(b.TempDir(), "fence.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := range 1000 {
		if _, _, err := s.MintAPIKey(b.Context(), tenancy.DefaultTeamID, "k"+strconv.Itoa(i)); err != nil {
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
}
