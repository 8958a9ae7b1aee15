package export

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
	"github.com/fencesandbox/fence/internal/store"
)

type templates map[string]string

func (t templates) Resolve(name string) (string, error) {
	if r, ok := t[name]; ok {
		return r, nil
	}
	return "", api.ErrNotFound
}

// setup starts a Manager on the fake backend whose audit trail is a real
// log, and an Exporter over both.
func setup(t *testing.T) (*sandbox.Manager, *audit.Log, *Exporter) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(audit.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	backend := fake.New(fake.Options{Host: fake.NewHost()})
	m, err := sandbox.New(sandbox.Options{Backend: backend, Store: st, Audit: al,
		Templates: templates{"base": "/rootfs/base"}, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Shutdown(context.Background())
		al.Close()
		st.Close()
	})
	return m, al, New(Options{Live: m, Usage: m.Meter(), Audit: al, Backend: backend.Name()})
}

// A live sandbox's bundle has its record (never its access tokens), its
// usage and its audit records; a backend that cannot read its layer is
// named in the metadata instead.
func TestExportLive(t *testing.T) {
	m, _, x := setup(t)
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := x.Export(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	md := b.Metadata.(map[string]any)
	if md["id"] != s.ID || md["state"] != sandbox.StateRunning {
		t.Errorf("metadata = %v, want sandbox %s running", md, s.ID)
	}
	if u, ok := b.Usage.(usage.Usage); !ok || u.SandboxID != s.ID {
		t.Errorf("usage = %#v, want sandbox %s's", b.Usage, s.ID)
	}
	if b.Audit == nil {
		t.Error("no audit records in the bundle of a daemon with an audit trail")
	}
	if md["changes"] != "the fake backend cannot read a sandbox's layer" || b.Layer != nil {
		t.Errorf("changes = %v, layer set %v: want the fake backend named", md["changes"], b.Layer != nil)
	}
	j, err := json.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	if s.EnvdAccessToken == "" || strings.Contains(string(j), s.EnvdAccessToken) {
		t.Errorf("metadata %s holds the sandbox's envd access token (or it has none)", j)
	}
}

// A killed sandbox's bundle is what the audit trail kept (its kill and
// usage records); without an archive it says its changes were not kept.
// A sandbox never known is not found.
func TestExportKilled(t *testing.T) {
	m, al, x := setup(t)
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(t.Context(), s.ID); err != nil {
		t.Fatal(err)
	}
	if err := al.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	b, err := x.Export(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	md := b.Metadata.(map[string]any)
	if md["state"] != "killed" || md["kill_reason"] == nil || md["created_at"] == nil {
		t.Errorf("metadata = %v, want a killed sandbox's with its create and kill", md)
	}
	if !strings.HasPrefix(md["changes"].(string), "not kept") || b.Layer != nil {
		t.Errorf("changes = %v, layer set %v: want not kept", md["changes"], b.Layer != nil)
	}
	if u, ok := b.Usage.(map[string]any); !ok || u["sandbox_id"] != s.ID || u["state"] != "killed" {
		t.Errorf("usage = %#v, want the kill's usage record", b.Usage)
	}
	for _, id := range []string{"inever0existed000000", "../etc"} {
		if _, err := x.Export(t.Context(), id); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Export(%q) = %v, want ErrNotFound", id, err)
		}
	}
}
