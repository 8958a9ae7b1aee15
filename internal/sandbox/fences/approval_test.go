package fences_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/sandbox"
)

// TestAllowNameAddsToThePolicy: the "sandbox" decision on an approval
// request puts the name in the sandbox's fence, its gateway's view and
// the allowOut it shows, and keeps the rest of its network.
func TestAllowNameAddsToThePolicy(t *testing.T) {
	nets, m := fakeCore(t)
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base",
		Network: &api.NetworkConfig{AllowOut: []string{"a.test"}, DenyOut: []string{"0.0.0.0/0"}, Approval: "ask"}})
	if err != nil {
		t.Fatal(err)
	}
	nw := nets.Net(s.ID)
	if ok, _ := nw.Policy().AllowName("b.test"); ok {
		t.Fatal("b.test allowed before the decision")
	}
	if err := nets.AllowName(t.Context(), s.ID, "b.test"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a.test", "b.test"} {
		if ok, _ := nw.Policy().AllowName(n); !ok {
			t.Errorf("%s not allowed after the decision", n)
		}
		if ok, _ := nets.GatewayConfig(s.ID).Policy.AllowName(n); !ok {
			t.Errorf("the gateway does not allow %s after the decision", n)
		}
	}
	if ok, _ := nw.Policy().AllowName("c.test"); ok {
		t.Error("c.test allowed")
	}
	got, err := m.Get(t.Context(), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network == nil || !slices.Equal(got.Network.AllowOut, []string{"a.test", "b.test"}) || got.Network.Approval != "ask" {
		t.Errorf("shown network %+v", got.Network)
	}
	if err := nets.AllowName(t.Context(), "missing", "b.test"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("AllowName of a missing sandbox: %v", err)
	}
}

func TestApprovalValidated(t *testing.T) {
	_, m := fakeCore(t)
	_, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base", Network: &api.NetworkConfig{Approval: "always"}})
	if !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("create with approval always: %v", err)
	}
}
