package secrets

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/store/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestClusterKey checks two nodes sharing one PostgreSQL database and one
// given key file: a secret one stores the other opens, the database holds
// neither the value nor the key, and a node without the key file does
// not start (it never makes a key of its own).
func TestClusterKey(t *testing.T) {
	dsn := pgtest.Database(t)
	keyPath := filepath.Join(t.TempDir(), "cluster.key")
	key := bytes.Repeat([]byte{0x5a}, keyLen)
	if err := os.WriteFile(keyPath, key, 0o600); err != nil {
		t.Fatal(err)
	}
	var nodes [2]*Store
	var dbs [2]*store.Store
	for i := range nodes {
		db, err := store.OpenWith(t.Context(), store.Options{Path: filepath.Join(t.TempDir(), "fence.db"), DatabaseURL: dsn})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		dbs[i] = db
		if nodes[i], err = Open(Options{DB: db, KeyPath: keyPath, NoCreate: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nodes[0].Create(t.Context(), "token", "s3cr3t-value", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := nodes[1].Value(t.Context(), "token"); err != nil || v != "s3cr3t-value" {
		t.Fatalf("the other node's Value = %q, %v", v, err)
	}
	sec, err := dbs[1].SecretByName(t.Context(), "token")
	if err != nil || bytes.Contains(sec.Sealed, []byte("s3cr3t-value")) || bytes.Contains(sec.Sealed, key) {
		t.Fatalf("stored record = %+v, %v: the value or the key is in the database", sec, err)
	}
	missing := filepath.Join(t.TempDir(), "missing.key")
	if _, err := Open(Options{DB: dbs[1], KeyPath: missing, NoCreate: true}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Open without the cluster's key = %v", err)
	}
	if _, err := os.Lstat(missing); !os.IsNotExist(err) {
		t.Fatalf("a key was made: %v", err)
	}
}
