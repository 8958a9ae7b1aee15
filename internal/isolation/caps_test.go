package isolation_test

import (
	"context"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
)

// wrapper hides every capability of the backend it wraps but Unwrap.
type wrapper struct{ isolation.Backend }

func (w wrapper) Unwrap() isolation.Backend { return w.Backend }

// hasAll is a wrapper with a Has of its own.
type hasAll struct{ wrapper }

func (hasAll) Has(string) bool { return true }

// sandboxWrapper hides the capabilities of the sandbox it wraps but Unwrap.
type sandboxWrapper struct{ isolation.Sandbox }

func (w sandboxWrapper) Unwrap() isolation.Sandbox { return w.Sandbox }

type haser interface{ Has(string) bool }

func TestAsWalksTheUnwrapChain(t *testing.T) {
	inner := fake.New(fake.Options{})
	if _, ok := isolation.As[haser](wrapper{wrapper{inner}}); ok {
		t.Fatal("As found a Has that nothing in the chain has")
	}
	h, ok := isolation.As[haser](wrapper{hasAll{wrapper{inner}}})
	if !ok || !h.Has("anything") {
		t.Fatalf("As = %v, %v; want the outermost Has", h, ok)
	}
	if got, ok := isolation.As[*fake.Backend](wrapper{wrapper{inner}}); !ok || got != inner {
		t.Fatalf("As = %v, %v; want the innermost backend", got, ok)
	}
	if _, ok := isolation.As[haser](wrapper{}); ok {
		t.Fatal("As found a Has behind a nil backend")
	}
	if _, ok := isolation.As[haser](nil); ok {
		t.Fatal("As found a Has in nil")
	}

	s, err := inner.Create(context.Background(), isolation.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Kill(context.Background())
	p, ok := isolation.As[isolation.Pauser](sandboxWrapper{sandboxWrapper{s}})
	if !ok || p != s.(isolation.Pauser) {
		t.Fatalf("As = %v, %v; want the wrapped sandbox's Pauser", p, ok)
	}
}
