// Package store persists fence's sandbox records, sealed secrets and
// package-download records in an embedded SQLite database
// (modernc.org/sqlite, pure Go) under the daemon's data directory.
//
// # Guarantees
//
//   - The database runs in WAL mode with a busy timeout, so concurrent
//     readers and one writer never fail with SQLITE_BUSY under normal load.
//   - The schema is versioned in a migrations table and upgraded in one
//     transaction by Open.
//   - Every query takes a context.
//   - The database and its -wal, -shm and -journal files are readable and
//     writable by their owner (root) alone, whatever the umask, and an
//     older database with wider modes is narrowed by Open.
//   - Environment variables given to a sandbox are never stored in
//     plaintext: they may hold secrets. What a filesystem-only pause keeps
//     for its resume (PauseCold) is stored as the caller sealed it. The
//     envd access token is stored while the sandbox runs and cleared when
//     it is marked killed.
//   - A secret's value is stored only as the sealed bytes internal/secrets
//     gives it; the store never sees a value.
//   - An API key's or access token's value is never stored: only its
//     SHA-256 (teams.go), looked up by hash and compared in constant
//     time; a revoked one never authenticates again.
//
// The store holds facts only; the lifecycle rules live in internal/sandbox.
package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fencesandbox/fence/api"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// ErrNotFound is returned for an unknown sandbox ID. It wraps api.ErrNotFound.
var ErrNotFound = fmt.Errorf("sandbox record %w", api.ErrNotFound)

// State is the state of a sandbox record.
type State string

// The states a sandbox record can be in.
const (
	StateRunning State = "running"
	// StatePaused is a sandbox stopped in place (its processes frozen),
	// which may run again.
	StatePaused State = "paused"
	StateKilled State = "killed"
)

// Sandbox is one sandbox record.
type Sandbox struct {
	ID       string
	Template string // the template's ID (a snapshot's ID)
	// Alias is the template's alias (a snapshot's name), "" if none.
	Alias               string
	State               State
	CreatedAt           time.Time // the start of its current run (reset when resumed)
	EndAt               time.Time // the deadline; for a paused sandbox, when it was paused
	Metadata            map[string]string
	CPUs                float64
	MemoryMB            int64
	DiskMB              int64
	EnvdAccessToken     string
	AllowInternetAccess *bool
	Network             *api.NetworkConfig
	Slot                int // the uid-range slot the backend used (0 if none)
	// Team owns the sandbox; Insert sets the team of its context when
	// empty.
	Team string
}

// Filter selects sandboxes in List. Zero fields select everything.
type Filter struct {
	// State, if set, selects only records in that state.
	State State
	// States, if not empty, selects only records in one of these states
	// (and State, if set, as well).
	States []State
	// Template, if set, selects only records of that template (its ID or
	// its alias).
	Template string
	// Metadata selects records whose metadata has every given pair.
	Metadata map[string]string
	// WithoutMetadataKeys selects records whose metadata has none of
	// these keys.
	WithoutMetadataKeys []string
	// StartedAfter, if set, selects records created at or after it.
	StartedAfter time.Time
	// Ascending lists oldest first (CreatedAt asc, ID asc); the default is
	// newest first.
	Ascending bool
	// Before, if set, selects records strictly after the cursor in List
	// order (older when descending, newer when ascending): the keyset for
	// pagination.
	Before *Cursor
	// Limit caps the number of records returned; 0 means no cap.
	Limit int
}

// Cursor is a position in List order.
type Cursor struct {
	CreatedAt time.Time
	ID        string
}

// Store is a handle on the database. It is safe for concurrent use.
type Store struct {
	// db holds the node's own records: its sandboxes, checkpoints,
	// snapshots and built templates (whose layers are on its disk), its
	// downloads. It is the SQLite file under the data directory.
	db *engine
	// shared holds the records every node of a cluster shares: teams,
	// credentials, limits, quota reservations, secrets, SSH keys. It is
	// db itself, or a PostgreSQL database (Options.DatabaseURL).
	shared *engine
}

// Options say where a Store keeps its records.
type Options struct {
	// Path is the node's SQLite database file. Required.
	Path string
	// DatabaseURL, if set, is a PostgreSQL URL (postgres://…) where the
	// records every node shares are kept instead of the file.
	DatabaseURL string
	// ConnectTimeout bounds the first contact with DatabaseURL; 0 means
	// 10 seconds.
	ConnectTimeout time.Duration
}

// Shared reports whether the shared records are in PostgreSQL.
func (s *Store) Shared() bool { return s.shared.pg }

// migrations are applied in order; their index+1 is the schema version.
// Append only: never edit a migration that has shipped.
var migrations = []string{
	`CREATE TABLE sandboxes (
		id                    TEXT PRIMARY KEY,
		template              TEXT NOT NULL,
		state                 TEXT NOT NULL CHECK (state IN ('running', 'killed')),
		created_at            INTEGER NOT NULL, -- unix nanoseconds
		end_at                INTEGER NOT NULL, -- unix nanoseconds
		metadata              TEXT NOT NULL DEFAULT '{}',
		cpu                   REAL NOT NULL,
		memory_mb             INTEGER NOT NULL,
		disk_mb               INTEGER NOT NULL,
		envd_access_token     TEXT NOT NULL DEFAULT '',
		allow_internet_access INTEGER, -- NULL, 0 or 1
		network               TEXT,    -- JSON or NULL
		slot                  INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX sandboxes_state_created ON sandboxes (state, created_at DESC, id DESC);`,
	// Secrets (values sealed by internal/secrets, never plaintext) and the
	// package downloads the egress gateway records.
	`CREATE TABLE secrets (
		id         TEXT PRIMARY KEY,
		name       TEXT NOT NULL UNIQUE,
		version    INTEGER NOT NULL,
		metadata   TEXT NOT NULL DEFAULT '{}',
		sealed     BLOB NOT NULL, -- nonce || AES-256-GCM ciphertext
		created_at INTEGER NOT NULL, -- unix nanoseconds
		updated_at INTEGER NOT NULL
	);
	CREATE INDEX secrets_created ON secrets (created_at DESC, id DESC);
	CREATE TABLE downloads (
		seq        INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id TEXT NOT NULL,
		time       INTEGER NOT NULL, -- unix nanoseconds
		ecosystem  TEXT NOT NULL,
		name       TEXT NOT NULL,
		version    TEXT NOT NULL,
		url        TEXT NOT NULL,
		size       INTEGER NOT NULL,
		sha256     TEXT NOT NULL
	);
	CREATE INDEX downloads_sandbox ON downloads (sandbox_id, seq);
	CREATE INDEX downloads_time ON downloads (time);`,
	// Paused sandboxes: SQLite cannot change a CHECK constraint, so the
	// table is made again with the same columns.
	`CREATE TABLE sandboxes_new (
		id                    TEXT PRIMARY KEY,
		template              TEXT NOT NULL,
		state                 TEXT NOT NULL CHECK (state IN ('running', 'paused', 'killed')),
		created_at            INTEGER NOT NULL, -- unix nanoseconds: the start of the current run
		end_at                INTEGER NOT NULL, -- unix nanoseconds: the deadline, or when it was paused
		metadata              TEXT NOT NULL DEFAULT '{}',
		cpu                   REAL NOT NULL,
		memory_mb             INTEGER NOT NULL,
		disk_mb               INTEGER NOT NULL,
		envd_access_token     TEXT NOT NULL DEFAULT '',
		allow_internet_access INTEGER,
		network               TEXT,
		slot                  INTEGER NOT NULL DEFAULT 0
	);
	INSERT INTO sandboxes_new (` + columns + `) SELECT ` + columns + ` FROM sandboxes;
	DROP TABLE sandboxes;
	ALTER TABLE sandboxes_new RENAME TO sandboxes;
	CREATE INDEX sandboxes_state_created ON sandboxes (state, created_at DESC, id DESC);`,
	// Built templates, their builds and tags (internal/tbuild keeps its
	// records as JSON documents; see templates.go).
	`CREATE TABLE built_templates (
		id    TEXT PRIMARY KEY,
		alias TEXT NOT NULL UNIQUE,
		doc   TEXT NOT NULL
	);
	CREATE TABLE template_builds (
		id          TEXT PRIMARY KEY,
		template_id TEXT NOT NULL,
		status      TEXT NOT NULL,
		doc         TEXT NOT NULL
	);
	CREATE INDEX template_builds_template ON template_builds (template_id);`,
	// Snapshots (E2B's snapshot templates) and checkpoints: each names a
	// filesystem layer the backend keeps (layers.go).
	migrationLayers,
	// What the resume of a filesystem-only pause needs (cold.go).
	migrationCold,
	// A record's template is its ID; the alias it was named by apart.
	`ALTER TABLE sandboxes ADD COLUMN alias TEXT NOT NULL DEFAULT ''`,
	// Teams, and their API keys and access tokens as hashes (teams.go).
	migrationTeams,
	// The teams' own limits (limits.go).
	migrationTeamLimits,
	// Every record's team (owner.go).
	migrationOwners,
	// Public keys of the SSH server (sshkeys.go).
	migrationSSHKeys,
	// What each sandbox takes of its team's quota, shared by nodes (quota.go).
	migrationQuotaReservations,
	// Volumes and the sandboxes that mount them (volumes.go).
	migrationVolumes,
	// Each snapshot's bytes, counted against its team's limit (quotas.go).
	migrationSnapshotBytes,
	// The teams' egress bytes of each day (quotas.go).
	migrationTeamEgress,
	// Each credential's role (teams.go).
	migrationCredentialRole,
	// The names approved for whole teams (quotas.go).
	migrationTeamNames,
	// The cluster's index of templates in its content registry
	// (sharedtemplates.go).
	migrationSharedTemplates,
	// Snapshots whose layers are in the cluster's registry (sharedsnaps.go).
	migrationSharedSnapshots,
	// Sandboxes moved off drained nodes through the registry (moved.go).
	migrationMovedSandboxes,
}

// Open opens (creating if needed) the database at path and migrates it to
// the current schema: OpenWith of the file alone.
func Open(ctx context.Context, path string) (*Store, error) {
	return OpenWith(ctx, Options{Path: path})
}

// OpenWith opens (creating if needed) the node's database file and, if
// o.DatabaseURL is set, the shared PostgreSQL database, and migrates both
// to the current schema. Nodes starting at once against one PostgreSQL
// database migrate it one at a time (under an advisory lock). A database
// that cannot be reached within o.ConnectTimeout is an error naming it
// (without its password).
func OpenWith(ctx context.Context, o Options) (*Store, error) {
	s, err := openFile(ctx, o.Path)
	if err != nil || o.DatabaseURL == "" {
		return s, err
	}
	pg, err := openPostgres(ctx, o.DatabaseURL, cmp.Or(o.ConnectTimeout, 10*time.Second))
	if err != nil {
		s.Close()
		return nil, err
	}
	s.shared = pg
	if err := s.migrate(ctx, pg); err != nil {
		s.Close()
		return nil, fmt.Errorf("migrating %s: %w", RedactDSN(o.DatabaseURL), err)
	}
	return s, nil
}

func openFile(ctx context.Context, path string) (*Store, error) {
	if err := restrictFiles(path); err != nil {
		return nil, err
	}
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	e := &engine{sql: db}
	s := &Store{db: e, shared: e}
	if err := s.migrate(ctx, e); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrating %s: %w", path, err)
	}
	return s, nil
}

// restrictFiles makes the database and its sidecar files readable by root
// alone, whatever the umask: they hold every running sandbox's envd access
// token. The database file is created 0600 here, before SQLite opens it,
// so SQLite gives the -wal, -shm and -journal files it creates the same
// mode; files an older version left with a wider mode are narrowed. A
// directory the database needs is created 0700.
func restrictFiles(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("creating database directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("opening %s: %w", path, err)
	}
	err = f.Chmod(0o600)
	f.Close()
	if err != nil {
		return fmt.Errorf("restricting %s: %w", path, err)
	}
	for _, sfx := range []string{"-wal", "-shm", "-journal"} {
		st, err := os.Lstat(path + sfx)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("restricting %s%s: %w", path, sfx, err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%s%s is not a regular file", path, sfx)
		}
		if st.Mode().Perm() != 0o600 {
			if err := os.Chmod(path+sfx, 0o600); err != nil {
				return fmt.Errorf("restricting %s%s: %w", path, sfx, err)
			}
		}
	}
	return nil
}

// Close closes the databases. It is idempotent.
func (s *Store) Close() error {
	err := s.db.Close()
	if s.shared != s.db {
		err = errors.Join(err, s.shared.Close())
	}
	return err
}

// migrate brings e's schema to the current version in one transaction;
// in PostgreSQL under an advisory lock first, so that nodes starting at
// once migrate one after the other (the later ones find nothing to do).
func (s *Store) migrate(ctx context.Context, e *engine) error {
	tx, err := e.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback()
	if e.pg {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("locking the schema: %w", err)
		}
	}
	ddl := `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`
	if e.pg {
		ddl = pgDDL(ddl)
	}
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("creating migrations table: %w", err)
	}
	var version int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&version); err != nil {
		return fmt.Errorf("reading schema version: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this binary's %d", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		m := migrations[i]
		if e.pg {
			m = pgDDL(m)
		}
		if _, err := tx.ExecContext(ctx, m); err != nil {
			return fmt.Errorf("applying migration %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`,
			i+1, time.Now().UnixNano()); err != nil {
			return fmt.Errorf("recording migration %d: %w", i+1, err)
		}
	}
	return tx.Commit()
}

const columns = `id, template, state, created_at, end_at, metadata, cpu, memory_mb, disk_mb,
	envd_access_token, allow_internet_access, network, slot`

// recordColumns are a record's columns today (columns is migration 3's).
const recordColumns = columns + `, alias, team`

// Insert adds a new record. An existing ID is an error wrapping api.ErrConflict.
func (s *Store) Insert(ctx context.Context, sb *Sandbox) error {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	mdJSON, err := json.Marshal(md)
	if err != nil {
		return fmt.Errorf("encoding metadata: %w", err)
	}
	var netJSON any
	if sb.Network != nil {
		b, err := json.Marshal(sb.Network)
		if err != nil {
			return fmt.Errorf("encoding network: %w", err)
		}
		netJSON = string(b)
	}
	var allow any
	if sb.AllowInternetAccess != nil {
		allow = *sb.AllowInternetAccess
	}
	state := sb.State
	if state == "" {
		state = StateRunning
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO sandboxes (`+recordColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sb.ID, sb.Template, string(state), sb.CreatedAt.UnixNano(), sb.EndAt.UnixNano(), string(mdJSON),
		sb.CPUs, sb.MemoryMB, sb.DiskMB, sb.EnvdAccessToken, allow, netJSON, sb.Slot, sb.Alias, ownerOf(ctx, sb.Team))
	if err != nil {
		if isUniqueViolation(err) {
			return fmt.Errorf("inserting sandbox %s: %w", sb.ID, api.ErrConflict)
		}
		return fmt.Errorf("inserting sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// Get returns the record of id, or an error wrapping ErrNotFound (also
// for another team's record when ctx acts for a principal).
func (s *Store) Get(ctx context.Context, id string) (*Sandbox, error) {
	cond, args := scope(ctx, "sandboxes")
	row := s.db.QueryRowContext(ctx, `SELECT `+recordColumns+` FROM sandboxes WHERE id = ? AND `+cond, append([]any{id}, args...)...)
	sb, err := scan(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("getting sandbox %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", id, err)
	}
	return sb, nil
}

// List returns the records matching f, newest first (CreatedAt desc, then
// ID desc): only those of ctx's team when it acts for a principal.
func (s *Store) List(ctx context.Context, f Filter) ([]*Sandbox, error) {
	cond, args := scope(ctx, "sandboxes")
	where := []string{cond}
	if f.State != "" {
		where = append(where, "state = ?")
		args = append(args, string(f.State))
	}
	if len(f.States) > 0 {
		where = append(where, "state IN (?"+strings.Repeat(",?", len(f.States)-1)+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	if f.Template != "" {
		where = append(where, "(template = ? OR alias = ?)")
		args = append(args, f.Template, f.Template)
	}
	for k, v := range f.Metadata {
		where = append(where, "EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) WHERE json_each.key = ? AND json_each.value = ?)")
		args = append(args, k, v)
	}
	for _, k := range f.WithoutMetadataKeys {
		where = append(where, "NOT EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) WHERE json_each.key = ?)")
		args = append(args, k)
	}
	if !f.StartedAfter.IsZero() {
		where = append(where, "created_at >= ?")
		args = append(args, f.StartedAfter.UnixNano())
	}
	cmp, order := "<", " ORDER BY created_at DESC, id DESC"
	if f.Ascending {
		cmp, order = ">", " ORDER BY created_at ASC, id ASC"
	}
	if f.Before != nil {
		where = append(where, "(created_at "+cmp+" ? OR (created_at = ? AND id "+cmp+" ?))")
		n := f.Before.CreatedAt.UnixNano()
		args = append(args, n, n, f.Before.ID)
	}
	q := `SELECT ` + recordColumns + ` FROM sandboxes`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += order
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("listing sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	return out, nil
}

// ListRunning returns every record in state running, newest first.
func (s *Store) ListRunning(ctx context.Context) ([]*Sandbox, error) {
	return s.List(ctx, Filter{State: StateRunning})
}

// UpdateEndAt sets the deadline of a running sandbox.
func (s *Store) UpdateEndAt(ctx context.Context, id string, endAt time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET end_at = ? WHERE id = ? AND state = 'running'`,
		endAt.UnixNano(), id)
	return checkOne(res, err, "updating deadline of sandbox "+id)
}

// Transition moves a record from state from to state to, setting the start
// of its current run and its deadline (for a paused record, the time it
// was paused), in one statement, and drops its ColdResume data. A record
// not in state from is an error wrapping ErrNotFound.
func (s *Store) Transition(ctx context.Context, id string, from, to State, startedAt, endAt time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET state = ?, created_at = ?, end_at = ?, cold = NULL WHERE id = ? AND state = ?`,
		string(to), startedAt.UnixNano(), endAt.UnixNano(), id, string(from))
	return checkOne(res, err, fmt.Sprintf("moving sandbox %s from %s to %s", id, from, to))
}

// SetState sets the state of a record. Marking a record killed also clears
// its envd access token, which is useless from then on.
func (s *Store) SetState(ctx context.Context, id string, st State) error {
	q := `UPDATE sandboxes SET state = ? WHERE id = ?`
	if st == StateKilled {
		q = `UPDATE sandboxes SET state = ?, envd_access_token = '', cold = NULL WHERE id = ?`
	}
	res, err := s.db.ExecContext(ctx, q, string(st), id)
	return checkOne(res, err, "setting state of sandbox "+id)
}

// Delete removes a record.
func (s *Store) Delete(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	return checkOne(res, err, "deleting sandbox "+id)
}

// DeleteKilledBefore removes killed records created before t and returns
// how many it removed.
func (s *Store) DeleteKilledBefore(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE state = 'killed' AND created_at < ?`, t.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("pruning killed sandboxes: %w", err)
	}
	return res.RowsAffected()
}

func checkOne(res sql.Result, err error, op string) error {
	return checkAffected(res, err, op, ErrNotFound)
}

// checkAffected wraps err, or missing when the statement changed no row,
// with op.
func checkAffected(res sql.Result, err error, op string, missing error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", op, missing)
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

func scan(r scanner) (*Sandbox, error) {
	var (
		sb            Sandbox
		state, mdJSON string
		created, end  int64
		allow         sql.NullBool
		netJSON       sql.NullString
	)
	if err := r.Scan(&sb.ID, &sb.Template, &state, &created, &end, &mdJSON, &sb.CPUs, &sb.MemoryMB,
		&sb.DiskMB, &sb.EnvdAccessToken, &allow, &netJSON, &sb.Slot, &sb.Alias, &sb.Team); err != nil {
		return nil, err
	}
	sb.State = State(state)
	sb.CreatedAt = time.Unix(0, created).UTC()
	sb.EndAt = time.Unix(0, end).UTC()
	if err := json.Unmarshal([]byte(mdJSON), &sb.Metadata); err != nil {
		return nil, fmt.Errorf("decoding metadata of %s: %w", sb.ID, err)
	}
	if allow.Valid {
		v := allow.Bool
		sb.AllowInternetAccess = &v
	}
	if netJSON.Valid {
		sb.Network = new(api.NetworkConfig)
		if err := json.Unmarshal([]byte(netJSON.String), sb.Network); err != nil {
			return nil, fmt.Errorf("decoding network of %s: %w", sb.ID, err)
		}
	}
	return &sb, nil
}
