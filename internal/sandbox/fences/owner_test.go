package fences

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestBindSecretsOfTheTeam: two teams each hold a secret named "tok"; a
// create of either binds its own team's, by ID, so that the gateway
// (which reads values for no team) swaps in that one and never the other
// team's.
func TestBindSecretsOfTheTeam(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sec, err := secrets.Open(secrets.Options{DB: st, KeyPath: filepath.Join(t.TempDir(), "secrets.key")})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Secrets: sec})
	for _, team := range []string{"team-a", "team-b"} {
		ctx := tenancy.NewContext(t.Context(), tenancy.Principal{Team: team, KeyID: "k"})
		made, err := sec.Create(ctx, "tok", "value-of-"+team, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, b, err := s.BindSecrets(ctx, []netconf.Binding{{Env: "T", Secret: "tok", Hosts: []string{"a.test"}}})
		if err != nil || len(b) != 1 || b[0].Secret != made.ID {
			t.Fatalf("BindSecrets(%s, tok) = %+v, %v; want the binding of %s", team, b, err, made.ID)
		}
		if v, err := sec.Value(context.Background(), b[0].Secret); err != nil || v != "value-of-"+team {
			t.Errorf("the gateway's value of %s's binding = %q, %v", team, v, err)
		}
	}
}
