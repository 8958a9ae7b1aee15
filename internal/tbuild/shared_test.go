package tbuild

import (
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/contentreg"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
	"github.com/google/go-containerregistry/pkg/registry"
)

// sharedNodes makes two Services ("nodes", each with its own records and
// trees) on one index and one in-process registry on loopback.
func sharedNodes(t *testing.T) (a, b *Service, index *store.Store) {
	t.Helper()
	if os.Getuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true needs root")
		}
		t.Skip("needs root (trees keep their owners)")
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	reg, err := contentreg.New(contentreg.Options{URL: strings.TrimPrefix(srv.URL, "http://") + "/fence"})
	if err != nil {
		t.Fatal(err)
	}
	index, err = store.Open(t.Context(), filepath.Join(t.TempDir(), "index.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { index.Close() })
	node := func(name string) *Service {
		dir := t.TempDir()
		st, err := store.Open(t.Context(), filepath.Join(dir, "fence.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		s, err := New(t.Context(), Options{Dir: filepath.Join(dir, "builds"), Store: st, Parents: noParents{},
			Registry: reg, Shared: index, Node: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	return node("a"), node("b"), index
}

// shareTemplate makes template alias ready on s with file f in its tree
// and shares it as a finished build does.
func shareTemplate(t *testing.T, s *Service, alias, f string) {
	t.Helper()
	root := readyTemplate(t, s, alias)
	if err := os.WriteFile(filepath.Join(root, "f"), []byte(f), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl, err := s.names.Lookup(alias)
	if err != nil {
		t.Fatal(err)
	}
	bid := tpl.Tags["default"].BuildID
	if _, err := s.share(t.Context(), bid, filepath.Base(root), Runtime{StartCmd: "serve"}); err != nil {
		t.Fatal(err)
	}
}

// A node pulls a template of the cluster at its first create for the
// template's team (or any team, once public), never for another team; a
// record gone from the index drops the node's copy; a template of the
// node's own of that name is a conflict, not replaced.
func TestFetchFromTheCluster(t *testing.T) {
	a, b, index := sharedNodes(t)
	ctx := t.Context()
	shareTemplate(t, a, "app", "from a")
	other := tenancy.NewContext(ctx, tenancy.Principal{Team: "other-team"})

	if err := b.Catalog().Fetch(other, "app"); err != nil {
		t.Fatalf("Fetch(app) for another team = %v", err)
	}
	if p, err := b.Catalog().Resolve("app"); err == nil {
		t.Fatalf("another team's private template was pulled: Resolve = %q", p)
	}
	if id, _, err := b.Alias("app"); err != nil || id != a.List()[0].TemplateID {
		t.Errorf("Alias(app) on b before any pull = %q, %v; want a's template", id, err)
	}
	if err := b.Catalog().Fetch(ctx, "app:default"); err != nil {
		t.Fatalf("Fetch(app) = %v", err)
	}
	root, err := b.Catalog().Resolve("app")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "f")); string(got) != "from a" {
		t.Errorf("b's copy of app has f = %q", got)
	}
	if l, ok := b.Catalog().Launch("app"); !ok || l.StartCmd != "serve" {
		t.Errorf("b's app launches with %+v, %v; want a's start command", l, ok)
	}
	if team, _, found := b.Owner("app"); !found || team != tenancy.DefaultTeamID {
		t.Errorf("Owner(app) on b = %q, %v", team, found)
	}

	// Public: any team pulls it.
	shareTemplate(t, a, "pub", "public")
	pub, err := a.names.Lookup("pub")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SetPublic(ctx, pub.ID, new(true)); err != nil {
		t.Fatal(err)
	}
	if err := b.Catalog().Fetch(other, "pub"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Catalog().Resolve("pub"); err != nil {
		t.Errorf("a public template was not pulled for another team: %v", err)
	}

	// Deleted in the cluster (through another node): dropped at next use.
	rec, err := index.SharedTemplate(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	if err := index.DeleteSharedTemplate(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Catalog().Fetch(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if p, err := b.Catalog().Resolve("app"); err == nil {
		t.Errorf("a template deleted in the cluster still resolves on b: %q", p)
	}

	// b's own template of a name the cluster also has is not replaced.
	readyTemplate(t, b, "mine")
	shareTemplate(t, a, "mine", "a's")
	if err := b.Catalog().Fetch(ctx, "mine"); !errors.Is(err, api.ErrConflict) {
		t.Errorf("Fetch(mine) with a template of b's own of that name = %v, want ErrConflict", err)
	}
}
