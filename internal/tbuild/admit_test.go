package tbuild

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// admitting are sandboxes that admit one build at a time.
type admitting struct {
	liveSandboxes
	mu      sync.Mutex
	running int
}

func (a *admitting) AdmitBuild(context.Context) (func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running >= 1 {
		return nil, fmt.Errorf("at the limit: %w", api.ErrResourceExhausted)
	}
	a.running++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.running--
		})
	}, nil
}

// A build refused by its Sandboxes' admission changes nothing (it stays
// waiting, and can be triggered later); an admitted build gives its room
// back when it ends.
func TestTriggerAsksAdmission(t *testing.T) {
	s := newTestService(t)
	sb := &admitting{}
	r := NewRunner(t.Context(), s, sb)
	one, err := r.Register(t.Context(), "one", nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	two, err := r.Register(t.Context(), "two", nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Trigger(t.Context(), one.TemplateID, one.BuildID, Spec{FromTemplate: "base"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Trigger(t.Context(), two.TemplateID, two.BuildID, Spec{FromTemplate: "base"}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("second Trigger = %v, want ErrResourceExhausted", err)
	}
	if info, err := r.Status(two.TemplateID, two.BuildID, 0, 0, ""); err != nil || info.Status != StatusWaiting {
		t.Fatalf("refused build: %+v, %v; want waiting", info, err)
	}
	// The first build fails (no build sandboxes here) and ends.
	deadline := time.Now().Add(time.Minute)
	for {
		sb.mu.Lock()
		n := sb.running
		sb.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first build's room was not given back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.Trigger(t.Context(), two.TemplateID, two.BuildID, Spec{FromTemplate: "base"}); err != nil {
		t.Fatalf("Trigger after the first build ended = %v", err)
	}
}
