package fences_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/isolation/warm"
	"github.com/fencesandbox/fence/internal/netfence"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/testutil"
)

// templates resolves template names to root directories.
type templates map[string]string

func (ts templates) Resolve(name string) (string, error) {
	if p, ok := ts[name]; ok {
		return p, nil
	}
	return "", fmt.Errorf("template %q: %w", name, api.ErrNotFound)
}

// fenceManager is a Set and the sandbox manager bound to it, over fake
// sandboxes that attach their fence to a real network namespace
// (fake.Options.NetNS), with a warm pool of size (none at 0) in front of
// the backend.
func fenceManager(t *testing.T, size int) (*fences.Set, *sandbox.Manager, *fake.Host, *warm.Pool) {
	t.Helper()
	testutil.RequireRoot(t)
	host := fake.NewHost()
	var be isolation.Backend = fake.New(fake.Options{Host: host, NetNS: true})
	var pool *warm.Pool
	if size > 0 {
		pool = warm.New(warm.Options{Backend: be, Size: size, RefillEvery: time.Millisecond})
		be = pool
	}
	nets, m := newCore(t, be)
	if pool != nil {
		t.Cleanup(func() { pool.Close(context.Background()) }) // before the manager's shutdown
	}
	if pool != nil {
		pool.Start(warm.Target{RootFS: "/rootfs/base", Limits: m.Defaults().Limits(), Network: nets.Pool()}, m.PoolBudget())
		if err := pool.WaitReady(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return nets, m, host, pool
}

func allows(nw *netfence.Net, dst string) bool {
	p := nw.Policy()
	return p != nil && p.Decide(policy.Flow{Proto: policy.TCP, Dst: netip.MustParseAddrPort(dst)}).Allow
}

// waitNoFence waits until nets holds no fence for id.
func waitNoFence(t *testing.T, nets *fences.Set, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for nets.Net(id) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the fence of %s outlived it", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPooledSandboxTakesItsFence: a warm pool's sandbox attaches the
// Set's deny-all pool fence when it starts; the create that takes it
// owns that fence (the same stack) and gives it the request's policy, an
// update changes it, and the fence goes with the sandbox.
func TestPooledSandboxTakesItsFence(t *testing.T) {
	nets, m, host, _ := fenceManager(t, 1)
	pooled := host.Running()
	if len(pooled) != 1 {
		t.Fatalf("host runs %v, want the pooled sandbox", pooled)
	}
	before := nets.Net(pooled[0])
	if before == nil {
		t.Fatalf("the pooled sandbox %s has no fence", pooled[0])
	}
	if now, ever := before.Attached(); now != 1 || ever != 1 {
		t.Fatalf("pooled fence: %d attached, %d ever; want 1, 1", now, ever)
	}
	if allows(before, "1.1.1.1:443") {
		t.Fatalf("the pooled sandbox's fence allows traffic before any create took it")
	}
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base", Network: &api.NetworkConfig{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if s.ID != pooled[0] {
		t.Fatalf("created %s, want the pooled %s", s.ID, pooled[0])
	}
	nw := nets.Net(s.ID)
	if nw != before {
		t.Fatalf("the handed-out sandbox's fence is not the one its namespace is attached to")
	}
	if !allows(nw, "1.1.1.1:443") || allows(nw, "8.8.8.8:443") {
		t.Errorf("the handed-out sandbox's fence does not have the request's policy")
	}
	if err := nets.UpdateNetwork(t.Context(), s.ID, nil, &api.NetworkConfig{AllowOut: []string{"8.8.8.8"}, DenyOut: []string{"0.0.0.0/0"}}); err != nil {
		t.Fatal(err)
	}
	if allows(nw, "1.1.1.1:443") || !allows(nw, "8.8.8.8:443") {
		t.Errorf("the fence does not follow the update")
	}
	if err := m.Kill(t.Context(), s.ID); err != nil {
		t.Fatal(err)
	}
	waitNoFence(t, nets, s.ID)
	if now, _ := nw.Attached(); now != 0 {
		t.Errorf("the killed sandbox's namespace is still attached")
	}
}

// TestFenceOfAFailedCreate: a create the Manager refuses after the
// backend made (and attached) the sandbox leaves no fence behind; a
// create the pool does not serve has its policy from the attach on.
func TestFenceOfAFailedCreate(t *testing.T) {
	nets, m, host, _ := fenceManager(t, 0)
	// No layers: a pause without memory is refused once the sandbox runs.
	_, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base", AutoPause: true, AutoPauseNoMemory: true})
	if !errors.Is(err, api.ErrUnimplemented) || !strings.Contains(err.Error(), "cannot pause without memory") {
		t.Fatalf("Create(autoPauseMemory false) without layers = %v, want the refusal after the backend's create", err)
	}
	if n := len(host.Running()); n != 0 {
		t.Fatalf("the refused create left %d sandboxes", n)
	}
	if left := nets.Len(); left != 0 {
		t.Errorf("the refused create left %d fences", left)
	}
	s, err := m.Create(t.Context(), sandbox.CreateRequest{TemplateID: "base", Network: &api.NetworkConfig{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}}})
	if err != nil {
		t.Fatal(err)
	}
	nw := nets.Net(s.ID)
	if nw == nil || !allows(nw, "1.1.1.1:443") {
		t.Fatalf("the created sandbox's fence lacks its policy")
	}
	if now, ever := nw.Attached(); now != 1 || ever != 1 {
		t.Errorf("fence: %d attached, %d ever; want 1, 1", now, ever)
	}
	if err := m.Kill(t.Context(), s.ID); err != nil {
		t.Fatal(err)
	}
	waitNoFence(t, nets, s.ID)
}
