package fences_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/store"
)

// newCore is a Set and the sandbox manager bound to it, over backend be.
func newCore(t *testing.T, be isolation.Backend) (*fences.Set, *sandbox.Manager) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	nets := fences.New(fences.Options{Logger: log})
	m, err := sandbox.New(sandbox.Options{Backend: be, Store: st, Templates: templates{"base": "/rootfs/base"},
		Network: nets, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Shutdown(context.Background())
		st.Close()
	})
	return nets, m
}

// fakeCore is newCore over fake sandboxes without a network namespace
// (a sandbox's Net is the one the manager owns from its create).
func fakeCore(t *testing.T) (*fences.Set, *sandbox.Manager) {
	host := fake.NewHost()
	t.Cleanup(host.Close)
	return newCore(t, fake.New(fake.Options{Host: host}))
}

// TestUpdateNetworkKeepsIngressAndBindings: an update replaces the
// egress policy of the sandbox's fence and of its gateway configuration,
// keeps the placeholders the sandbox holds bound, keeps the ingress
// fields it shows, and records allow_internet_access.
func TestUpdateNetworkKeepsIngressAndBindings(t *testing.T) {
	nets, m := fakeCore(t)
	closed := false
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base",
		Network: &api.NetworkConfig{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"},
			AllowPublicTraffic: &closed, MaskRequestHost: "app.test"},
		Secrets: map[string]api.SecretBinding{"TOKEN": {Secret: "tok", Hosts: []string{"api.test"}}}})
	if err != nil {
		t.Fatal(err)
	}
	before := nets.GatewayConfig(s.ID)
	if before == nil || len(before.Bindings) != 1 {
		t.Fatalf("gateway config at create = %+v, want one binding", before)
	}
	open := true
	if err := nets.UpdateNetwork(t.Context(), s.ID, &open, &api.NetworkConfig{AllowOut: []string{"8.8.8.8"}, DenyOut: []string{"0.0.0.0/0"},
		MaskRequestHost: "other.test"}); err != nil {
		t.Fatal(err)
	}
	nw := nets.Net(s.ID)
	if allows(nw, "1.1.1.1:443") || !allows(nw, "8.8.8.8:443") {
		t.Errorf("the fence does not follow the update")
	}
	after := nets.GatewayConfig(s.ID)
	if after == nil || after.Policy != nw.Policy() {
		t.Errorf("the gateway config does not follow the update")
	}
	if len(after.Bindings) != 1 || after.Bindings[0].Placeholder != before.Bindings[0].Placeholder {
		t.Errorf("bindings after update = %+v, want %+v", after.Bindings, before.Bindings)
	}
	got, err := m.Get(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network == nil || got.Network.MaskRequestHost != "app.test" || got.Network.AllowPublicTraffic == nil || *got.Network.AllowPublicTraffic {
		t.Errorf("shown network after update = %+v, want the create's ingress fields", got.Network)
	}
	if len(got.Network.AllowOut) != 1 || got.Network.AllowOut[0] != "8.8.8.8" {
		t.Errorf("shown allowOut after update = %v, want [8.8.8.8]", got.Network.AllowOut)
	}
	if got.AllowInternetAccess == nil || !*got.AllowInternetAccess {
		t.Errorf("allow_internet_access after update = %v, want true", got.AllowInternetAccess)
	}
	if err := m.Kill(t.Context(), s.ID); err != nil {
		t.Fatal(err)
	}
	if nets.GatewayConfig(s.ID) != nil || nets.Net(s.ID) != nil {
		t.Errorf("the killed sandbox's gateway config or fence is still held")
	}
}

// TestUpdateNetworkBadInputChangesNothing: an invalid update is an error
// wrapping api.ErrInvalidArgument and leaves the fence, the gateway
// config and what the sandbox shows as they were; an unknown sandbox is
// api.ErrNotFound.
func TestUpdateNetworkBadInputChangesNothing(t *testing.T) {
	nets, m := fakeCore(t)
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base",
		Network: &api.NetworkConfig{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}})
	if err != nil {
		t.Fatal(err)
	}
	pol, cfg := nets.Net(s.ID).Policy(), nets.GatewayConfig(s.ID)
	err = nets.UpdateNetwork(t.Context(), s.ID, nil, &api.NetworkConfig{AllowOut: []string{"not a host!"}})
	if !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("UpdateNetwork(bad allowOut) = %v, want ErrInvalidArgument", err)
	}
	if nets.Net(s.ID).Policy() != pol || nets.GatewayConfig(s.ID) != cfg {
		t.Errorf("a refused update changed the fence or the gateway config")
	}
	got, _ := m.Get(t.Context(), s.ID)
	if got.Network == nil || len(got.Network.AllowOut) != 1 || got.Network.AllowOut[0] != "1.1.1.1" {
		t.Errorf("a refused update changed the shown network: %+v", got.Network)
	}
	if err := nets.UpdateNetwork(t.Context(), "nope", nil, &api.NetworkConfig{}); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("UpdateNetwork(unknown) = %v, want ErrNotFound", err)
	}
}

// TestDialPortFollowsTheCore: ingress to an unknown sandbox is
// isolation.ErrNotFound and to a paused one isolation.ErrPaused, as the
// core knows them.
func TestDialPortFollowsTheCore(t *testing.T) {
	nets, m := fakeCore(t)
	if _, err := nets.DialPort(t.Context(), "nope", 80); !errors.Is(err, isolation.ErrNotFound) {
		t.Errorf("DialPort(unknown) = %v, want ErrNotFound", err)
	}
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pauses().Pause(t.Context(), s.ID, sandbox.WithMemory); err != nil {
		t.Fatal(err)
	}
	if _, err := nets.DialPort(t.Context(), s.ID, 80); !errors.Is(err, isolation.ErrPaused) {
		t.Errorf("DialPort(paused) = %v, want ErrPaused", err)
	}
}
