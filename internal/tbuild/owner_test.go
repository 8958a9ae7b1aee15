package tbuild

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/template"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// A built template is the team's that registered it: another team's
// create finds it exactly as an unknown name, unless it is public, and
// cannot register a template of its alias.
func TestCatalogResolveForTeams(t *testing.T) {
	dir := t.TempDir()
	own, err := template.New(template.Options{Dir: filepath.Join(dir, "templates")})
	if err != nil {
		t.Fatal(err)
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
	reg, err := s.Register(t.Context(), "app", nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := s.Catalog()
	other := tenancy.NewContext(t.Context(), tenancy.Principal{Team: "team-b", KeyID: "kb"})
	_, unknown := c.Resolve("nosuchtemplate")
	for _, name := range []string{"app", reg.TemplateID} {
		_, err := c.ResolveFor(other, name)
		if err == nil || strings.ReplaceAll(err.Error(), name, "N") != strings.ReplaceAll(unknown.Error(), "nosuchtemplate", "N") {
			t.Errorf("ResolveFor(team-b, %s) = %v, want as an unknown name: %v", name, err, unknown)
		}
	}
	_, mine := c.ResolveFor(t.Context(), "app")
	if _, err := c.Resolve("app"); mine == nil || err == nil || mine.Error() != err.Error() {
		t.Errorf("ResolveFor(default team, app) = %v, want Resolve's %v", mine, err)
	}
	if mine.Error() == strings.ReplaceAll(unknown.Error(), "nosuchtemplate", "app") {
		t.Fatalf("Resolve(app) = %v: the test cannot tell a hidden template from a known one", mine)
	}
	if team, public, found := s.Owner("app"); !found || public || team != tenancy.DefaultTeamID {
		t.Errorf("Owner(app) = %q, %v, %v", team, public, found)
	}
	if _, err := s.Register(other, "app", nil, 0, 0); !errors.Is(err, api.ErrConflict) {
		t.Errorf("team-b's Register(app), the default team's alias = %v, want a conflict", err)
	}
	if _, err := s.Register(other, "bapp", nil, 0, 0); err != nil {
		t.Fatal(err)
	}
	if team, _, found := s.Owner("bapp"); !found || team != "team-b" {
		t.Errorf("Owner(bapp) = %q, %v; want team-b's", team, found)
	}
	_, unknownB := c.Resolve("nosuchtemplate")
	if _, err := c.ResolveFor(t.Context(), "bapp"); err == nil || strings.ReplaceAll(err.Error(), "bapp", "N") != strings.ReplaceAll(unknownB.Error(), "nosuchtemplate", "N") {
		t.Errorf("ResolveFor(default team, team-b's bapp) = %v, want as an unknown name", err)
	}
	pub := true
	if _, err := s.SetPublic(t.Context(), reg.TemplateID, &pub); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResolveFor(other, "app"); err == nil || err.Error() != mine.Error() {
		t.Errorf("ResolveFor(team-b, public app) = %v, want the default team's answer %v", err, mine)
	}
}
