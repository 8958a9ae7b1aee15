// Package pgtest starts a real PostgreSQL server for tests: Debian's
// postgresql package's initdb and pg_ctl, in a temporary directory,
// listening on a free loopback port, never a system service.
//
// # Guarantees
//
//   - One server per test binary, started on first use (Start) and
//     stopped by Main after the tests, or one per test (New) stopped at
//     its cleanup; each caller of Database gets a new, empty database of
//     its own.
//   - The server listens on 127.0.0.1 only; it trusts loopback
//     connections (a test server, never reachable from elsewhere).
//   - As root, the server runs as the postgres user (initdb refuses root),
//     in a directory that user owns.
//   - Without PostgreSQL installed, Database skips the test, or fails it
//     when CI=true.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Server is a running PostgreSQL server.
type Server struct {
	dir    string
	port   int
	bin    string
	runAs  string // "" or the user pg_ctl runs as
	admin  *sql.DB
	nextDB atomic.Int64
}

var (
	once    sync.Once
	server  *Server
	errBoot error
)

// Bin returns the directory of the newest installed PostgreSQL's
// programs, or "" when none is installed (initdb is not on PATH in
// Debian: it is looked for by path).
func Bin() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > b
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

// Start returns the binary's server, starting it on first use. Without
// PostgreSQL it skips t, or fails it under CI=true.
func Start(t testing.TB) *Server {
	t.Helper()
	once.Do(func() { server, errBoot = boot() })
	if errBoot != nil {
		if errors.Is(errBoot, errMissing) && os.Getenv("CI") != "true" {
			t.Skip(errBoot)
		}
		t.Fatal(errBoot)
	}
	return server
}

// New starts a server of t's own, stopped at t's cleanup (for packages
// without a TestMain calling Main). Without PostgreSQL it skips t, or
// fails it under CI=true.
func New(t testing.TB) *Server {
	t.Helper()
	s, err := boot()
	if err != nil {
		if errors.Is(err, errMissing) && os.Getenv("CI") != "true" {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

// Database returns the URL of a new, empty database on the binary's
// server.
func Database(t testing.TB) string {
	t.Helper()
	return Start(t).Database(t)
}

// Database makes a new, empty database and returns its URL.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d", s.nextDB.Add(1))
	if _, err := s.admin.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	return s.url(name)
}

func (s *Server) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

var errMissing = errors.New("PostgreSQL is not installed (the postgresql package; scripts/setup.sh all)")

func boot() (*Server, error) {
	bin := Bin()
	if bin == "" {
		return nil, errMissing
	}
	dir, err := os.MkdirTemp("", "fence-pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running PostgreSQL as root needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		s.runAs = "postgres"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	data := filepath.Join(dir, "data")
	if out, err := s.run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if out, err := s.start(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_ctl start: %w: %s %s", err, out, log)
	}
	if s.admin, err = sql.Open("pgx", s.url("postgres")); err == nil {
		err = s.admin.Ping()
	}
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("connecting to the test server: %w", err)
	}
	return s, nil
}

// Crash stops the server as a kill -9 would (pg_ctl stop -m immediate:
// no checkpoint, recovery from the WAL at the next start), then starts it
// again on the same port.
func (s *Server) Crash(t testing.TB) {
	t.Helper()
	data := filepath.Join(s.dir, "data")
	if out, err := s.run("pg_ctl", "stop", "-m", "immediate", "-D", data); err != nil {
		t.Fatalf("pg_ctl stop: %v: %s", err, out)
	}
	if out, err := s.start(); err != nil {
		t.Fatalf("pg_ctl start: %v: %s", err, out)
	}
}

func (s *Server) start() ([]byte, error) {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200", s.port, s.dir)
	return s.run("pg_ctl", "start", "-w", "-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "log"), "-o", opts)
}

func (s *Server) run(prog string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, prog)
	var cmd *exec.Cmd
	if s.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	return cmd.CombinedOutput()
}

// Stop stops the server at once and removes its directory.
func (s *Server) stop() {
	if s.admin != nil {
		s.admin.Close()
	}
	s.run("pg_ctl", "stop", "-m", "immediate", "-D", filepath.Join(s.dir, "data"))
	os.RemoveAll(s.dir)
}

// Main runs the tests and then stops the server if one was started:
// call it from TestMain as os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if server != nil {
		server.stop()
	}
	return code
}

// Admin returns a connection to the server's maintenance database, for
// tests that look at or break things behind the store's back.
func (s *Server) Admin() *sql.DB { return s.admin }

// Port is the server's loopback port.
func (s *Server) Port() int { return s.port }
