package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Errors of the identity records. Each wraps an api sentinel.
var (
	// ErrTeamNotFound is returned for an unknown team.
	ErrTeamNotFound = fmt.Errorf("team %w", api.ErrNotFound)
	// ErrCredentialNotFound is returned for an unknown API key or access
	// token, one of another team, and one already revoked.
	ErrCredentialNotFound = fmt.Errorf("credential %w", api.ErrNotFound)
	// ErrCredentialInvalid is returned by Authenticate for a value that
	// is no live credential: unknown, malformed or revoked.
	ErrCredentialInvalid = fmt.Errorf("credential is unknown or revoked: %w", api.ErrUnauthenticated)
)

// MaxNameLen bounds the names of teams, API keys and access tokens, in
// bytes.
const MaxNameLen = 256

// Kind is what a credential is.
type Kind string

// The kinds of credential. An API key (X-API-Key) acts for its team on
// the sandbox routes; an access token (Authorization: Bearer) manages its
// team's API keys and access tokens as well.
const (
	KindAPIKey      Kind = "api_key"
	KindAccessToken Kind = "access_token"
)

// Prefix is the fixed start of a credential of kind k: "e2b_" for API
// keys, "sk_e2b_" for access tokens, as E2B makes them.
func (k Kind) Prefix() string {
	if k == KindAccessToken {
		return "sk_e2b_"
	}
	return "e2b_"
}

// secretBytes is the randomness of a credential: 256 bits, written as 64
// lower-case hex digits after the prefix.
const secretBytes = 32

// Team is one team record.
type Team struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// Credential is one API key or access token record. The value itself is
// never stored: only its hash, and the few characters its mask shows.
type Credential struct {
	ID   string
	Team string
	Kind Kind
	Name string
	// MaskPrefix and MaskSuffix are the first 2 and last 4 characters of
	// the value after its prefix; ValueLength its length after the prefix.
	MaskPrefix  string
	MaskSuffix  string
	ValueLength int
	// CreatedBy is the ID of the credential that minted this one ("" when
	// the daemon or an admin acting for no key did).
	CreatedBy string
	CreatedAt time.Time
	LastUsed  time.Time // zero: never used
	RevokedAt time.Time // zero: live
	// Role is "" (the team's full rights) or tenancy.RoleAuditor.
	Role string
}

// Principal is who a request with this credential acts for.
func (c *Credential) Principal() tenancy.Principal {
	return tenancy.Principal{Team: c.Team, KeyID: c.ID, Auditor: c.Role == tenancy.RoleAuditor}
}

// migrationTeams adds the teams and their credentials; the default team,
// owner of everything made before, exists from the start.
var migrationTeams = `CREATE TABLE teams (
		id         TEXT PRIMARY KEY,
		name       TEXT NOT NULL,
		created_at INTEGER NOT NULL -- unix nanoseconds
	);
	INSERT INTO teams (id, name, created_at) VALUES ('` + tenancy.DefaultTeamID + `', 'default', 0);
	CREATE TABLE credentials (
		id           TEXT PRIMARY KEY,
		team_id      TEXT NOT NULL REFERENCES teams (id),
		kind         TEXT NOT NULL CHECK (kind IN ('api_key', 'access_token')),
		name         TEXT NOT NULL,
		hash         TEXT NOT NULL UNIQUE, -- HashCredential of the value
		mask_prefix  TEXT NOT NULL,
		mask_suffix  TEXT NOT NULL,
		value_length INTEGER NOT NULL,
		created_by   TEXT NOT NULL DEFAULT '',
		created_at   INTEGER NOT NULL,
		last_used    INTEGER NOT NULL DEFAULT 0,
		revoked_at   INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX credentials_team ON credentials (team_id, kind, created_at);`

// HashCredential is the form a credential value is stored and looked up
// in: "$sha256$" and the unpadded base64 of the SHA-256 of the value. A
// value is 256 random bits, so a plain hash is as hard to invert as the
// value is to guess.
func HashCredential(value string) string {
	sum := sha256.Sum256([]byte(value))
	return "$sha256$" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// WellFormed reports whether value looks like a credential of kind k:
// its prefix and then lower-case hex digits only (any other value is
// refused without a lookup).
func WellFormed(k Kind, value string) bool {
	rest, ok := strings.CutPrefix(value, k.Prefix())
	if !ok || rest == "" || len(rest) > 128 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func checkName(what, name string) error {
	if strings.TrimSpace(name) == "" {
		return fmt.Errorf("%s name is empty: %w", what, api.ErrInvalidArgument)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%s name is %d bytes, more than %d: %w", what, len(name), MaxNameLen, api.ErrInvalidArgument)
	}
	return nil
}

// NewID returns a random UUID (version 4) in lower case.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// CreateTeam adds a team named name. An empty or overlong name is an
// error wrapping api.ErrInvalidArgument.
func (s *Store) CreateTeam(ctx context.Context, name string) (*Team, error) {
	if err := checkName("team", name); err != nil {
		return nil, err
	}
	t := &Team{ID: NewID(), Name: name, CreatedAt: time.Now().UTC()}
	if _, err := s.shared.ExecContext(ctx, `INSERT INTO teams (id, name, created_at) VALUES (?, ?, ?)`,
		t.ID, t.Name, t.CreatedAt.UnixNano()); err != nil {
		return nil, fmt.Errorf("creating team: %w", err)
	}
	return t, nil
}

// Team returns the team id, or an error wrapping ErrTeamNotFound.
func (s *Store) Team(ctx context.Context, id string) (*Team, error) {
	var (
		t       Team
		created int64
	)
	err := s.shared.QueryRowContext(ctx, `SELECT id, name, created_at FROM teams WHERE id = ?`, id).Scan(&t.ID, &t.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting team %.64q: %w", id, ErrTeamNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting team: %w", err)
	}
	t.CreatedAt = time.Unix(0, created).UTC()
	return &t, nil
}

// Teams returns every team, oldest first (the default team first).
func (s *Store) Teams(ctx context.Context) ([]*Team, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT id, name, created_at FROM teams ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("listing teams: %w", err)
	}
	defer rows.Close()
	var out []*Team
	for rows.Next() {
		var (
			t       Team
			created int64
		)
		if err := rows.Scan(&t.ID, &t.Name, &created); err != nil {
			return nil, fmt.Errorf("listing teams: %w", err)
		}
		t.CreatedAt = time.Unix(0, created).UTC()
		out = append(out, &t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing teams: %w", err)
	}
	return out, nil
}

// Mint makes a new credential of kind k named name for team, and returns
// its value (the only time it is ever known: the store keeps its hash)
// with its record. createdBy is the ID of the credential the caller
// authenticated with, or "". An unknown team is an error wrapping
// ErrTeamNotFound, a bad name one wrapping api.ErrInvalidArgument.
func (s *Store) Mint(ctx context.Context, team string, k Kind, name, createdBy string) (string, *Credential, error) {
	return s.MintRole(ctx, team, k, name, createdBy, "")
}

// MintRole is Mint of a credential with role ("" or, for an API key,
// tenancy.RoleAuditor; another is an error wrapping
// api.ErrInvalidArgument).
func (s *Store) MintRole(ctx context.Context, team string, k Kind, name, createdBy, role string) (string, *Credential, error) {
	if role != "" && (role != tenancy.RoleAuditor || k != KindAPIKey) {
		return "", nil, fmt.Errorf("role %.64q: want %q for an API key, or none: %w", role, tenancy.RoleAuditor, api.ErrInvalidArgument)
	}
	if k != KindAPIKey && k != KindAccessToken {
		return "", nil, fmt.Errorf("credential kind %q: %w", k, api.ErrInvalidArgument)
	}
	if err := checkName("key", name); err != nil {
		return "", nil, err
	}
	var b [secretBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, fmt.Errorf("minting a credential: %w", err)
	}
	secret := hex.EncodeToString(b[:])
	c := &Credential{ID: NewID(), Team: team, Kind: k, Name: name, MaskPrefix: secret[:2],
		MaskSuffix: secret[len(secret)-4:], ValueLength: len(secret), CreatedBy: createdBy,
		CreatedAt: time.Now().UTC(), Role: role}
	value := k.Prefix() + secret
	// The team's existence and the insert are one statement: a team
	// cannot vanish in between.
	res, err := s.shared.ExecContext(ctx, `INSERT INTO credentials (id, team_id, kind, name, hash, mask_prefix,
		mask_suffix, value_length, created_by, created_at, role)
		SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM teams WHERE id = ?)`,
		c.ID, c.Team, string(k), c.Name, HashCredential(value), c.MaskPrefix, c.MaskSuffix, c.ValueLength,
		c.CreatedBy, c.CreatedAt.UnixNano(), role, team)
	if err != nil {
		return "", nil, fmt.Errorf("minting a credential: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return "", nil, fmt.Errorf("minting a credential: %w", err)
	} else if n == 0 {
		return "", nil, fmt.Errorf("minting a credential for team %.64q: %w", team, ErrTeamNotFound)
	}
	return value, c, nil
}

// MintAPIKey makes a new API key named name for team and returns its
// value and record: Mint of KindAPIKey by no one.
func (s *Store) MintAPIKey(ctx context.Context, team, name string) (string, *Credential, error) {
	return s.Mint(ctx, team, KindAPIKey, name, "")
}

const credentialColumns = `id, team_id, kind, name, hash, mask_prefix, mask_suffix, value_length,
	created_by, created_at, last_used, revoked_at, role`

func scanCredential(r scanner) (*Credential, string, error) {
	var (
		c                        Credential
		kind, hash               string
		created, used, revokedAt int64
	)
	if err := r.Scan(&c.ID, &c.Team, &kind, &c.Name, &hash, &c.MaskPrefix, &c.MaskSuffix, &c.ValueLength,
		&c.CreatedBy, &created, &used, &revokedAt, &c.Role); err != nil {
		return nil, "", err
	}
	c.Kind = Kind(kind)
	c.CreatedAt = time.Unix(0, created).UTC()
	if used != 0 {
		c.LastUsed = time.Unix(0, used).UTC()
	}
	if revokedAt != 0 {
		c.RevokedAt = time.Unix(0, revokedAt).UTC()
	}
	return &c, hash, nil
}

// Authenticate returns the live credential of kind k whose value is
// value, or an error wrapping ErrCredentialInvalid (unknown, malformed,
// another kind, or revoked). The stored hash is compared with the
// value's in constant time.
func (s *Store) Authenticate(ctx context.Context, k Kind, value string) (*Credential, error) {
	if !WellFormed(k, value) {
		return nil, fmt.Errorf("authenticating: %w", ErrCredentialInvalid)
	}
	want := HashCredential(value)
	row := s.shared.QueryRowContext(ctx, `SELECT `+credentialColumns+` FROM credentials WHERE hash = ?`, want)
	c, hash, err := scanCredential(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("authenticating: %w", ErrCredentialInvalid)
	}
	if err != nil {
		return nil, fmt.Errorf("authenticating: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(hash), []byte(want)) != 1 || c.Kind != k || !c.RevokedAt.IsZero() {
		return nil, fmt.Errorf("authenticating: %w", ErrCredentialInvalid)
	}
	return c, nil
}

// TouchCredential records that credential id was used at t, unless a use
// within the minute before t is already recorded (so a busy key costs a
// write a minute, not one a request).
func (s *Store) TouchCredential(ctx context.Context, id string, t time.Time) error {
	_, err := s.shared.ExecContext(ctx, `UPDATE credentials SET last_used = ? WHERE id = ? AND last_used < ?`,
		t.UnixNano(), id, t.Add(-time.Minute).UnixNano())
	if err != nil {
		return fmt.Errorf("recording a credential's use: %w", err)
	}
	return nil
}

// Credentials returns team's live credentials of kind k, oldest first.
func (s *Store) Credentials(ctx context.Context, team string, k Kind) ([]*Credential, error) {
	rows, err := s.shared.QueryContext(ctx, `SELECT `+credentialColumns+` FROM credentials
		WHERE team_id = ? AND kind = ? AND revoked_at = 0 ORDER BY created_at, id`, team, string(k))
	if err != nil {
		return nil, fmt.Errorf("listing credentials: %w", err)
	}
	defer rows.Close()
	var out []*Credential
	for rows.Next() {
		c, _, err := scanCredential(rows)
		if err != nil {
			return nil, fmt.Errorf("listing credentials: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing credentials: %w", err)
	}
	return out, nil
}

// Credential returns team's live credential id of kind k, or an error
// wrapping ErrCredentialNotFound (also for another team's).
func (s *Store) Credential(ctx context.Context, team string, k Kind, id string) (*Credential, error) {
	row := s.shared.QueryRowContext(ctx, `SELECT `+credentialColumns+` FROM credentials
		WHERE id = ? AND team_id = ? AND kind = ? AND revoked_at = 0`, id, team, string(k))
	c, _, err := scanCredential(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting credential: %w", ErrCredentialNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting credential: %w", err)
	}
	return c, nil
}

// RenameCredential renames team's live credential id of kind k. A missing
// one (or another team's) is an error wrapping ErrCredentialNotFound.
func (s *Store) RenameCredential(ctx context.Context, team string, k Kind, id, name string) error {
	if err := checkName("key", name); err != nil {
		return err
	}
	res, err := s.shared.ExecContext(ctx, `UPDATE credentials SET name = ?
		WHERE id = ? AND team_id = ? AND kind = ? AND revoked_at = 0`, name, id, team, string(k))
	return checkCredential(res, err, "renaming credential")
}

// RevokeCredential revokes team's live credential id of kind k at t:
// Authenticate refuses it from then on. The record stays (the audit trail
// names it). A missing or already revoked one (or another team's) is an
// error wrapping ErrCredentialNotFound.
func (s *Store) RevokeCredential(ctx context.Context, team string, k Kind, id string, t time.Time) error {
	res, err := s.shared.ExecContext(ctx, `UPDATE credentials SET revoked_at = ?
		WHERE id = ? AND team_id = ? AND kind = ? AND revoked_at = 0`, t.UnixNano(), id, team, string(k))
	return checkCredential(res, err, "revoking credential")
}

func checkCredential(res sql.Result, err error, op string) error {
	return checkAffected(res, err, op, ErrCredentialNotFound)
}

// TeamExists reports whether team id exists (the limits routes' check).
func (s *Store) TeamExists(ctx context.Context, id string) (bool, error) {
	if _, err := s.Team(ctx, id); err != nil {
		if errors.Is(err, ErrTeamNotFound) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}
