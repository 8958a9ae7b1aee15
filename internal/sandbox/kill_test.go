package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/store"
)

// killStore is a store that closes killed when a record is marked killed.
type killStore struct {
	*store.Store
	killed chan struct{}
}

func (s killStore) SetState(ctx context.Context, id string, st store.State) error {
	err := s.Store.SetState(ctx, id, st)
	if st == store.StateKilled {
		close(s.killed)
	}
	return err
}

// waitingBackend makes sandboxes whose Kill waits (at most wait) for the
// store's record to be marked killed, and reports whether it was.
type waitingBackend struct {
	isolation.Backend
	killed chan struct{}
	wait   time.Duration
	seen   chan bool
}

func (b waitingBackend) Create(ctx context.Context, spec isolation.Spec) (isolation.Sandbox, error) {
	sb, err := b.Backend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return waitingSandbox{Sandbox: sb, b: b}, nil
}

type waitingSandbox struct {
	isolation.Sandbox
	b waitingBackend
}

func (s waitingSandbox) Kill(ctx context.Context) error {
	select {
	case <-s.b.killed:
		s.b.seen <- true
	case <-time.After(s.b.wait):
		s.b.seen <- false
	}
	return s.Sandbox.Kill(ctx)
}

// TestKillRecordsBesideTheBackend: a kill's update of the store runs
// beside the backend's kill rather than after it, and the kill answers
// once both are done.
func TestKillRecordsBesideTheBackend(t *testing.T) {
	killed := make(chan struct{})
	seen := make(chan bool, 1)
	e := newEnv(t, func(o *Options) {
		o.Store = killStore{Store: o.Store.(*store.Store), killed: killed}
		o.Backend = waitingBackend{Backend: o.Backend, killed: killed, wait: 2 * time.Second, seen: seen}
	})
	s := e.mustCreate(t, CreateRequest{})
	if err := e.m.Kill(t.Context(), s.ID); err != nil {
		t.Fatalf("Kill(%s) = %v", s.ID, err)
	}
	if !<-seen {
		t.Error("the backend's kill ended before the store's record was marked killed: they ran one after the other")
	}
	rec, err := e.store.Get(t.Context(), s.ID)
	if err != nil || rec.State != store.StateKilled {
		t.Errorf("record after Kill = %+v, %v; want killed", rec, err)
	}
}
