package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// engine is a database/sql handle of one dialect. The store's statements
// are written once, in the portable subset of SQLite's syntax (`?`
// placeholders, INTEGER/TEXT/BLOB/REAL columns, INSERT … ON CONFLICT);
// for PostgreSQL, placeholders become $n and column types their
// PostgreSQL equivalents (each statement rewritten once, then cached).
// On SQLite, a statement run outside a transaction is prepared once (per
// connection) and kept, up to maxStmts of them: SQLite's parsing and code
// generation were most of a small write's CPU time (pgx keeps its own
// cache of prepared statements).
type engine struct {
	sql *sql.DB
	pg  bool
	// rebound caches each statement's PostgreSQL form (string → string).
	rebound sync.Map
	// stmts holds SQLite's prepared statements (string → *sql.Stmt);
	// nstmts counts them, prepares counts the preparations.
	stmts    sync.Map
	nstmts   atomic.Int64
	prepares atomic.Int64
}

// maxStmts bounds the statements an engine keeps prepared: the store's
// statements are a fixed set, and those built from a filter's fields
// have few forms.
const maxStmts = 256

// stmt returns q prepared, or nil when it is not kept (on PostgreSQL,
// past maxStmts, or when its preparation fails: run unprepared, it gives
// the error again where it is reported).
func (e *engine) stmt(ctx context.Context, q string) *sql.Stmt {
	if e.pg {
		return nil
	}
	if v, ok := e.stmts.Load(q); ok {
		return v.(*sql.Stmt)
	}
	if e.nstmts.Load() >= maxStmts {
		return nil
	}
	st, err := e.sql.PrepareContext(context.WithoutCancel(ctx), q)
	if err != nil {
		return nil
	}
	e.prepares.Add(1)
	if v, loaded := e.stmts.LoadOrStore(q, st); loaded {
		st.Close() // another caller's came first
		return v.(*sql.Stmt)
	}
	e.nstmts.Add(1)
	return st
}

// queryer is what engine and engineTx have in common.
type queryer interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

func (e *engine) rebind(q string) string {
	if !e.pg {
		return q
	}
	if v, ok := e.rebound.Load(q); ok {
		return v.(string)
	}
	r := rebind(q)
	e.rebound.Store(q, r)
	return r
}

// args adapts arguments to the engine: PostgreSQL's INTEGER columns
// (BIGINT there) take no Go bool, so a bool becomes 0 or 1 as SQLite
// stores it.
func (e *engine) args(args []any) []any {
	if !e.pg {
		return args
	}
	var out []any // a copy, made at the first bool: the caller's slice stays
	for i, a := range args {
		b, ok := a.(bool)
		if !ok {
			continue
		}
		if out == nil {
			out = slices.Clone(args)
		}
		out[i] = int64(0)
		if b {
			out[i] = int64(1)
		}
	}
	if out == nil {
		return args
	}
	return out
}

func (e *engine) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := e.stmt(ctx, q); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return e.sql.ExecContext(ctx, e.rebind(q), e.args(args)...)
}

func (e *engine) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := e.stmt(ctx, q); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return e.sql.QueryContext(ctx, e.rebind(q), e.args(args)...)
}

func (e *engine) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	if st := e.stmt(ctx, q); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return e.sql.QueryRowContext(ctx, e.rebind(q), e.args(args)...)
}

// BeginTx begins a transaction whose statements are rebound as the
// engine's.
func (e *engine) BeginTx(ctx context.Context, opts *sql.TxOptions) (*engineTx, error) {
	tx, err := e.sql.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &engineTx{tx: tx, e: e}, nil
}

// Close closes the prepared statements and the handle.
func (e *engine) Close() error {
	e.stmts.Range(func(_, v any) bool {
		v.(*sql.Stmt).Close()
		return true
	})
	return e.sql.Close()
}

// engineTx is a transaction of an engine.
type engineTx struct {
	tx *sql.Tx
	e  *engine
}

func (t *engineTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, t.e.rebind(q), t.e.args(args)...)
}

func (t *engineTx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, t.e.rebind(q), t.e.args(args)...)
}

func (t *engineTx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, t.e.rebind(q), t.e.args(args)...)
}

// Commit commits the transaction.
func (t *engineTx) Commit() error { return t.tx.Commit() }

// Rollback aborts the transaction; after Commit it does nothing.
func (t *engineTx) Rollback() error { return t.tx.Rollback() }

// rebind rewrites q's ? placeholders as $1, $2, …, leaving string
// literals, quoted identifiers and comments alone.
func rebind(q string) string {
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(q[i+1:], c)
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j+2])
			i += j + 1
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				b.WriteString(q[i:])
				return b.String()
			}
			b.WriteString(q[i : i+j])
			i += j - 1
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// pgTypes are the column types of the store's DDL and their PostgreSQL
// forms: unix nanoseconds overflow PostgreSQL's 32-bit INTEGER, and its
// REAL is single precision.
var pgTypes = []struct {
	re  *regexp.Regexp
	new string
}{
	{regexp.MustCompile(`\bINTEGER\s+PRIMARY\s+KEY\s+AUTOINCREMENT\b`), "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"},
	{regexp.MustCompile(`\bINTEGER\b`), "BIGINT"},
	{regexp.MustCompile(`\bBLOB\b`), "BYTEA"},
	{regexp.MustCompile(`\bREAL\b`), "DOUBLE PRECISION"},
}

// pgDDL returns a migration's PostgreSQL form.
func pgDDL(m string) string {
	for _, t := range pgTypes {
		m = t.re.ReplaceAllString(m, t.new)
	}
	return m
}

// serialize makes tx wait for, then hold until it ends, the lock named
// name: in PostgreSQL an advisory lock, so that a count and the insert it
// allows are not interleaved with another node's (READ COMMITTED would
// let both see the same count). SQLite runs one writer at a time: there
// it does nothing.
func (t *engineTx) serialize(ctx context.Context, name string) error {
	if !t.e.pg {
		return nil
	}
	if _, err := t.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext(?))`, "fence:"+name); err != nil {
		return fmt.Errorf("locking %s: %w", name, err)
	}
	return nil
}

// migrationLock is the PostgreSQL advisory lock every node takes to
// migrate the schema: one migrates, the others wait and then find it
// current.
const migrationLock = 0x66656e6365 // "fence"

// maxConns bounds a node's connections to PostgreSQL.
const maxConns = 16

// openPostgres opens the PostgreSQL database at dsn and checks that it
// answers within timeout.
func openPostgres(ctx context.Context, dsn string, timeout time.Duration) (*engine, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("opening the database: %w", err)
	}
	// A node keeps a bounded pool: PostgreSQL's connections are
	// processes, shared by every node (max_connections).
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("reaching the database %s: %w", RedactDSN(dsn), err)
	}
	return &engine{sql: db, pg: true}, nil
}

// RedactDSN returns dsn with its password, if any, replaced by "xxxxx",
// for messages and logs.
func RedactDSN(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(an unparsable database URL)"
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// isUniqueViolation reports whether err is a UNIQUE (or PRIMARY KEY)
// constraint's refusal, in either engine.
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505"
	}
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint")
}
