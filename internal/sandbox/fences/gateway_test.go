package fences

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/secrets"
	"github.com/fencesandbox/fence/internal/store"
)

// TestGatewayReadsTheSet: the interceptor the Set gives each sandbox's
// stack reads the sandbox's gateway configuration from the Set itself:
// none (nothing intercepted) until SetGateway, then the sandbox's, and
// none again after Drop.
func TestGatewayReadsTheSet(t *testing.T) {
	ca, err := gateway.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Options{CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Gateway: gw, InspectByDefault: true})
	icpt := s.fence.Interceptor("sb1")
	if icpt.InterceptTLS("api.test") {
		t.Fatal("a sandbox without a gateway config is intercepted")
	}
	nc, err := s.Compile(t.Context(), netconf.Request{Network: &api.NetworkConfig{AllowOut: []string{"api.test"}, DenyOut: []string{"0.0.0.0/0"}}})
	if err != nil {
		t.Fatal(err)
	}
	s.SetGateway("sb1", nc, nil)
	if !icpt.InterceptTLS("api.test") {
		t.Error("the handed-out sandbox is not inspected under InspectByDefault")
	}
	if other := s.fence.Interceptor("sb2"); other.InterceptTLS("api.test") {
		t.Error("another sandbox's interceptor reads sb1's config")
	}
	s.Drop("sb1")
	if icpt.InterceptTLS("api.test") {
		t.Error("a dropped sandbox is still intercepted")
	}
}

// TestBindSecretsRefusesUnknownSecret: a binding to a secret the store
// holds gets a placeholder (never the value); one to a secret it does
// not hold is invalid input, and nothing is bound.
func TestBindSecretsRefusesUnknownSecret(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sec, err := secrets.Open(secrets.Options{DB: st, KeyPath: filepath.Join(t.TempDir(), "secrets.key")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sec.Create(t.Context(), "known", "the-value", nil); err != nil {
		t.Fatal(err)
	}
	s := New(Options{Secrets: sec})
	env, b, err := s.BindSecrets(t.Context(), []netconf.Binding{{Env: "A", Secret: "known", Hosts: []string{"a.test"}}})
	if err != nil || len(b) != 1 || env["A"] != b[0].Placeholder || b[0].Placeholder == "the-value" {
		t.Fatalf("BindSecrets(known) = %v, %+v, %v; want one placeholder binding", env, b, err)
	}
	env, b, err = s.BindSecrets(t.Context(), []netconf.Binding{{Env: "B", Secret: "missing"}})
	if !errors.Is(err, api.ErrInvalidArgument) || env != nil || b != nil {
		t.Errorf("BindSecrets(missing) = %v, %v, %v; want ErrInvalidArgument and nothing bound", env, b, err)
	}
}
