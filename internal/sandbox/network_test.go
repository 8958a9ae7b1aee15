package sandbox

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
)

// TestProxyPasswordNeverStored checks that the egress proxy's password
// reaches neither the store (its records or the database files) nor the
// manager's view of the sandbox.
func TestProxyPasswordNeverStored(t *testing.T) {
	const pw = "p4ssw0rd-never-stored"
	dir := t.TempDir()
	e := newEnv(t, func(o *Options) {
		st, err := store.Open(t.Context(), filepath.Join(dir, "fence.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		o.Store = st
	})
	sb := e.mustCreate(t, CreateRequest{Network: &api.NetworkConfig{
		EgressProxy: &api.EgressProxy{Address: "198.51.100.5:1080", Username: "alice", Password: pw},
	}})
	if err := e.m.fences.UpdateNetwork(t.Context(), sb.ID, nil, &api.NetworkConfig{
		EgressProxy: &api.EgressProxy{Address: "198.51.100.6:1080", Username: "bob", Password: pw + "2"},
	}); err != nil {
		t.Fatal(err)
	}
	got, err := e.m.Get(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{sb, got} {
		b, _ := json.Marshal(v)
		if bytes.Contains(b, []byte(pw)) {
			t.Errorf("manager view %s holds the password", b)
		}
	}
	recs, err := e.m.store.List(t.Context(), store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if b, _ := json.Marshal(r); bytes.Contains(b, []byte(pw)) {
			t.Errorf("store record %s holds the password", b)
		}
	}
	e.m.Kill(t.Context(), sb.ID)
	ents, _ := os.ReadDir(dir)
	for _, ent := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, ent.Name()))
		if bytes.Contains(b, []byte(pw)) {
			t.Errorf("database file %s holds the password", ent.Name())
		}
	}
}
