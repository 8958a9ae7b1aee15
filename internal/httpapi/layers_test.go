package httpapi

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/timetravel"
	"github.com/fencesandbox/fence/internal/store"
)

type layerRoute struct{ method, path, body string }

// layerRoutes are the snapshot, fork, checkpoint, rewind and diff routes
// of sandbox id.
func layerRoutes(id string) []layerRoute {
	return []layerRoute{
		{"POST", "/sandboxes/" + id + "/snapshots", `{}`},
		{"GET", "/snapshots", ""},
		{"POST", "/sandboxes/" + id + "/fork", `{"count":1}`},
		{"POST", "/sandboxes/" + id + "/checkpoints", `{}`},
		{"GET", "/sandboxes/" + id + "/checkpoints", ""},
		{"POST", "/sandboxes/" + id + "/rewind", `{"checkpointID":"cp1"}`},
		{"GET", "/sandboxes/" + id + "/diff", ""},
	}
}

// TestLayerRoutesGoToTheKeeper: the snapshot, fork, checkpoint, rewind
// and diff routes answer 501 without Options.Layers, and are the
// keeper's with it (on the fake backend, which keeps no layers, the
// keeper's own 501, naming the backend).
func TestLayerRoutesGoToTheKeeper(t *testing.T) {
	e := newTestEnv(t)
	id := e.create(t, `{"templateID":"base"}`).SandboxID
	for _, r := range layerRoutes(id) {
		resp, b := e.api(t, r.method, r.path, r.body)
		wantError(t, r.method+" "+r.path+" without a keeper", resp, b, 501, "not supported by this daemon")
	}

	// A manager given a keeper (sandbox.New binds the one to the other),
	// on a store and fake host of its own.
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	tmpls := templates{"base": "/rootfs/base"}
	k := timetravel.New(timetravel.Options{Store: st, Templates: tmpls})
	m, err := sandbox.New(sandbox.Options{Backend: fake.New(fake.Options{Host: host}), Store: st, Templates: tmpls, Keeper: k})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := k.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Manager: m, Pauses: m.Pauses(), Layers: k, APIKey: testKey, Domain: "fence.test"}))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background())
		k.Close()
		host.Close()
		st.Close()
	})
	withKeeper := &testEnv{srv: srv, m: m}
	id = withKeeper.create(t, `{"templateID":"base"}`).SandboxID
	for _, r := range layerRoutes(id) {
		resp, b := withKeeper.api(t, r.method, r.path, r.body)
		wantError(t, r.method+" "+r.path+" with a keeper", resp, b, 501, "filesystem layers, which the fake backend does not keep")
	}
}
