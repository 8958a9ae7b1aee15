package names

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
)

func TestParseName(t *testing.T) {
	for _, c := range []struct {
		in        string
		ns, alias string
		tag       string
		bad       bool
	}{
		{in: "app", alias: "app"},
		{in: " App:V1 ", alias: "app", tag: "v1"},
		{in: "team/app:default", ns: "team", alias: "app"},
		{in: "app:1.2.3", alias: "app", tag: "1.2.3"},
		{in: "", bad: true},
		{in: "a/b/c", bad: true},
		{in: "app:bad tag", bad: true},
		{in: "../etc", bad: true},
	} {
		n, err := ParseName(c.in)
		if c.bad {
			if !errors.Is(err, api.ErrInvalidArgument) {
				t.Errorf("ParseName(%q) = %+v, %v; want ErrInvalidArgument", c.in, n, err)
			}
			continue
		}
		if err != nil || n.Namespace != c.ns || n.Alias != c.alias || n.Tag != c.tag {
			t.Errorf("ParseName(%q) = %+v, %v", c.in, n, err)
		}
	}
}

func openRegistry(t *testing.T, st *store.Store) *Registry {
	t.Helper()
	r, err := Open(t.Context(), Options{Store: st, Namespace: "team"})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// A name selects a ready build only: through a tag that points at it, or
// by the build's ID as the tag; an alias that is another template's ID
// is a conflict; a build of another template is never selected.
func TestResolveSelectsReadyBuilds(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	r := openRegistry(t, st)
	app, err := r.Claim(Name{Alias: "app"})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := r.Claim(Name{Alias: "other"})
	if again, _ := r.Claim(Name{Alias: "app"}); again.ID != app.ID {
		t.Errorf("a second claim of an alias made template %s, want %s", again.ID, app.ID)
	}
	if _, err := r.Claim(Name{Alias: app.ID}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("claiming another template's ID as an alias = %v, want ErrConflict", err)
	}
	const b1, b2, bo = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222", "33333333-3333-4333-8333-333333333333"
	if _, _, err := r.Resolve(Name{Alias: "app"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a template without a ready build resolves (%v)", err)
	}
	r.Publish(app.ID, b1, []string{DefaultTag, "v1"})
	r.Publish(other.ID, bo, []string{DefaultTag})
	r.Save(ctx, app.ID)
	for _, c := range []struct {
		n    Name
		want string
	}{
		{Name{Alias: "app"}, b1},
		{Name{Alias: "app", Tag: "v1"}, b1},
		{Name{Namespace: "team", Alias: "app"}, b1},
		{Name{Alias: app.ID}, b1},
		{Name{Alias: "app", Tag: b1}, b1},
	} {
		if tm, b, err := r.Resolve(c.n); err != nil || b != c.want || tm.ID != app.ID {
			t.Errorf("Resolve(%+v) = %s, %s, %v; want %s", c.n, tm.ID, b, err, c.want)
		}
	}
	for _, n := range []Name{{Alias: "app", Tag: "v2"}, {Alias: "app", Tag: b2}, {Alias: "app", Tag: bo}, {Namespace: "elsewhere", Alias: "app"}, {Alias: "nope"}} {
		if _, b, err := r.Resolve(n); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Resolve(%+v) = %s, %v; want ErrNotFound", n, b, err)
		}
	}

	// Tags move to a later build, persist, and the default one stays.
	r.Ready(app.ID, b2)
	if b, tags, err := r.AssignTags(ctx, "app:"+b2, []string{" V2 "}); err != nil || b != b2 || len(tags) != 1 || tags[0] != "v2" {
		t.Fatalf("AssignTags = %s, %v, %v", b, tags, err)
	}
	if err := r.RemoveTags(ctx, "app", []string{"default"}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("removing the default tag = %v, want ErrInvalidArgument", err)
	}
	if err := r.RemoveTags(ctx, "app", []string{"v1"}); err != nil {
		t.Fatal(err)
	}
	pub := true
	if names, err := r.SetPublic(ctx, app.ID, &pub); err != nil || len(names) != 1 || names[0] != "team/app" {
		t.Errorf("SetPublic = %v, %v", names, err)
	}
	re := openRegistry(t, st)
	re.Ready(app.ID, b2)
	if _, b, err := re.Resolve(Name{Alias: "app", Tag: "v2"}); err != nil || b != b2 {
		t.Errorf("after a reopen app:v2 = %s, %v; want %s", b, err, b2)
	}
	if _, _, err := re.Resolve(Name{Alias: "app", Tag: "v1"}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a removed tag resolves after a reopen (%v)", err)
	}
	if id, public, found, err := re.Alias(Name{Alias: "app"}); err != nil || !found || !public || id != app.ID {
		t.Errorf("Alias(app) = %s, %v, %v, %v", id, public, found, err)
	}

	// Forgotten and erased, a template and its builds resolve no more.
	re.Forget(app.ID)
	if err := re.Erase(ctx, app.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := re.Resolve(Name{Alias: app.ID, Tag: b2}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a forgotten template resolves (%v)", err)
	}
	if _, ok := openRegistry(t, st).Get(app.ID); ok {
		t.Error("an erased template is back after a reopen")
	}
}
