package tbuild

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/tbuild/content"
)

// liveSandboxes are sandboxes that live, as a sandbox manager would list
// them; no build sandbox can be made in them.
type liveSandboxes []LiveSandbox

func (l liveSandboxes) CreateBox(context.Context, BoxSpec) (string, isolation.Sandbox, error) {
	return "", nil, errors.New("no build sandboxes in this test")
}
func (l liveSandboxes) Kill(context.Context, string) error          { return nil }
func (l liveSandboxes) Live(context.Context) ([]LiveSandbox, error) { return l, nil }
func (l liveSandboxes) CreatesInFlight() int                        { return 0 }

// readyTemplate registers template alias with one ready build whose tree
// exists, and returns the tree's path.
func readyTemplate(t *testing.T, s *Service, alias string) string {
	t.Helper()
	reg, err := s.Register(t.Context(), alias, nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	tree := "tree-" + alias
	if err := os.MkdirAll(s.content.TreePath(tree), 0o755); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	b := s.builds[reg.BuildID]
	b.Status, b.Tree = StatusReady, tree
	s.names.Publish(b.TemplateID, b.ID, b.Tags)
	s.mu.Unlock()
	return s.content.TreePath(tree)
}

// The Service resolves its templates with no sandboxes at all; the Runner
// made over it afterwards runs the builds and deletes templates in the
// sandboxes it is given: without any, a build is unavailable and a
// deleted template's trees are kept (no one can tell no sandbox uses
// them).
func TestRunnerWithoutSandboxes(t *testing.T) {
	s := newTestService(t)
	tree := readyTemplate(t, s, "app")
	if p, err := s.Catalog().Resolve("app"); err != nil || p != tree {
		t.Fatalf("Catalog().Resolve(app) = %q, %v; want %q", p, err, tree)
	}
	r := NewRunner(t.Context(), s, nil)
	reg, err := r.Register(t.Context(), "app", nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Trigger(t.Context(), reg.TemplateID, reg.BuildID, Spec{FromTemplate: "base"})
	if !errors.Is(err, api.ErrUnavailable) {
		t.Errorf("Trigger without sandboxes = %v, want ErrUnavailable", err)
	}
	if err := r.Delete(t.Context(), "app"); err != nil {
		t.Fatalf("Delete(app) = %v", err)
	}
	if p, err := r.Catalog().Resolve("app"); err == nil {
		t.Errorf("Resolve(app) after Delete = %q, want an error", p)
	}
	if _, err := os.Stat(tree); err != nil {
		t.Errorf("a deleted template's tree went with no sandboxes to ask: %v", err)
	}
}

// A Runner refuses to delete a template a live sandbox of its sandboxes
// uses; deleting one none uses removes its tree.
func TestRunnerDeleteAsksItsSandboxes(t *testing.T) {
	s := newTestService(t)
	tree := readyTemplate(t, s, "app")
	busy := NewRunner(t.Context(), s, liveSandboxes{{Template: "app:default", Paused: true}})
	err := busy.Delete(t.Context(), "app")
	if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), "paused sandboxes using it") {
		t.Errorf("Delete(app) with a paused sandbox of it = %v, want ErrInvalidArgument naming the paused sandboxes", err)
	}
	if _, err := s.Catalog().Resolve("app"); err != nil {
		t.Errorf("Resolve(app) after a refused Delete = %v", err)
	}
	idle := NewRunner(t.Context(), s, liveSandboxes{{Template: "other"}})
	if err := idle.Delete(t.Context(), "app"); err != nil {
		t.Fatalf("Delete(app) with no sandbox of it = %v", err)
	}
	if _, err := os.Stat(tree); !os.IsNotExist(err) {
		t.Errorf("the deleted template's tree is still there (%v)", err)
	}
}

// NewRunner collects the trees of deleted templates that no live sandbox
// of its sandboxes names, and keeps those a live one names.
func TestNewRunnerCollects(t *testing.T) {
	s := newTestService(t)
	for _, alias := range []string{"kept", "gone"} {
		tree := "tree-" + alias
		if err := os.MkdirAll(s.content.TreePath(tree), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := s.content.Bury(content.Tombstone{ID: "id-" + alias, Alias: alias, Trees: []string{tree}}); err != nil {
			t.Fatal(err)
		}
	}
	NewRunner(t.Context(), s, liveSandboxes{{Template: "kept"}})
	if _, err := os.Stat(s.content.TreePath("tree-kept")); err != nil {
		t.Errorf("the tree of a deleted template a live sandbox names went: %v", err)
	}
	if _, err := os.Stat(s.content.TreePath("tree-gone")); !os.IsNotExist(err) {
		t.Errorf("the tree of a deleted template no sandbox names is still there (%v)", err)
	}
}
