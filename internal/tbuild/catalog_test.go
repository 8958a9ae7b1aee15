package tbuild

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/template"
)

// The catalog resolves fence's own templates when no built template has
// the name: their name is their ID and alias, and a template made from an
// image gives its sandboxes the image's env, workdir and named user.
func TestCatalogOwnTemplates(t *testing.T) {
	dir := t.TempDir()
	tdir := filepath.Join(dir, "templates")
	own, err := template.New(template.Options{Dir: tdir})
	if err != nil {
		t.Fatal(err)
	}
	for name, info := range map[string]template.Info{
		"plain": {},
		"img":   {Env: []string{"A=1", "B=x=y", "=bad"}, WorkDir: "/work", User: "app:app"},
		"uid":   {User: "1001"},
	} {
		info.FormatVersion = template.FormatVersion
		if err := os.MkdirAll(filepath.Join(tdir, name, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(info)
		if err := os.WriteFile(filepath.Join(tdir, name, "template.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(t.Context(), filepath.Join(dir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := New(t.Context(), Options{Dir: filepath.Join(dir, "builds"), Store: st, Parents: own})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := s.Catalog()

	if p, err := c.Resolve("img"); err != nil || p != filepath.Join(tdir, "img", "rootfs") {
		t.Errorf("Resolve(img) = %q, %v", p, err)
	}
	if _, err := c.Resolve("nope"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Resolve(nope) = %v, want ErrNotFound", err)
	}
	if id, alias, ok := c.Identity("plain"); !ok || id != "plain" || alias != "plain" {
		t.Errorf("Identity(plain) = %q, %q, %v", id, alias, ok)
	}
	if _, _, ok := c.Identity("nope"); ok {
		t.Error("Identity(nope) is known")
	}
	l, ok := c.Launch("img")
	if want := map[string]string{"A": "1", "B": "x=y"}; !ok || l.Workdir != "/work" || l.User != "app" || !maps.Equal(l.Env, want) {
		t.Errorf("Launch(img) = %+v, %v", l, ok)
	}
	if l, ok := c.Launch("uid"); !ok || l.User != "" {
		t.Errorf("Launch(uid) = %+v, %v; want no user (a uid is left to the default user)", l, ok)
	}
	if _, ok := c.Launch("plain"); ok {
		t.Error("Launch(plain): a template with nothing to give gives something")
	}
}
