package httpapi

import (
	"net/http/httptest"
	"testing"

	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/timetravel"
)

// TestLayerRoutesGoToTheKeeper: the snapshot, fork, checkpoint, rewind
// and diff routes answer 501 without Options.Layers, and are the
// keeper's with it (on the fake backend, which keeps no layers, the
// keeper's own 501, naming the backend).
func TestLayerRoutesGoToTheKeeper(t *testing.T) {
	e := newTestEnv(t)
	id := e.create(t, `{"templateID":"base"}`).SandboxID
	routes := []struct{ method, path, body string }{
		{"POST", "/sandboxes/" + id + "/snapshots", `{}`},
		{"GET", "/snapshots", ""},
		{"POST", "/sandboxes/" + id + "/fork", `{"count":1}`},
		{"POST", "/sandboxes/" + id + "/checkpoints", `{}`},
		{"GET", "/sandboxes/" + id + "/checkpoints", ""},
		{"POST", "/sandboxes/" + id + "/rewind", `{"checkpointID":"cp1"}`},
		{"GET", "/sandboxes/" + id + "/diff", ""},
	}
	for _, r := range routes {
		resp, b := e.api(t, r.method, r.path, r.body)
		wantError(t, r.method+" "+r.path+" without a keeper", resp, b, 501, "not supported by this daemon")
	}

	k := timetravel.New(timetravel.Options{Store: e.st, Templates: templates{"base": "/rootfs/base"}})
	k.Bind(sandbox.NewLayerPort(e.m))
	srv := httptest.NewServer(New(Options{Manager: e.m, Layers: k, APIKey: testKey, Domain: "fence.test"}))
	t.Cleanup(srv.Close)
	withKeeper := &testEnv{srv: srv, m: e.m}
	for _, r := range routes {
		resp, b := withKeeper.api(t, r.method, r.path, r.body)
		wantError(t, r.method+" "+r.path+" with a keeper", resp, b, 501, "filesystem layers, which the fake backend does not keep")
	}
}
