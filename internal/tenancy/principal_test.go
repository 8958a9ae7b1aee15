package tenancy

import (
	"context"
	"testing"
)

func TestPrincipalContext(t *testing.T) {
	if _, ok := FromContext(context.Background()); ok {
		t.Fatal("a bare context acts for a principal")
	}
	p := Principal{Team: "t1", KeyID: "k1"}
	got, ok := FromContext(NewContext(context.Background(), p))
	if !ok || got != p {
		t.Fatalf("FromContext = %+v, %v; want %+v", got, ok, p)
	}
	if _, ok := FromContext(NewContext(context.Background(), Principal{KeyID: "k"})); ok {
		t.Fatal("a principal without a team counts")
	}
}

func TestOwnership(t *testing.T) {
	bare := context.Background()
	a := NewContext(bare, Principal{Team: "a", KeyID: "k"})
	if TeamOf(bare) != DefaultTeamID || TeamOf(a) != "a" {
		t.Fatalf("TeamOf = %q, %q", TeamOf(bare), TeamOf(a))
	}
	for _, c := range []struct {
		ctx   context.Context
		owner string
		want  bool
	}{
		{bare, "a", true}, {bare, "", true},
		{a, "a", true}, {a, "b", false}, {a, "", false},
		{NewContext(bare, Principal{Team: DefaultTeamID}), "", true},
	} {
		if got := Visible(c.ctx, c.owner); got != c.want {
			t.Errorf("Visible(%v, %q) = %v, want %v", TeamOf(c.ctx), c.owner, got, c.want)
		}
	}
	if Scope(bare) != "" || Scope(a) != "a" {
		t.Fatalf("Scope = %q, %q", Scope(bare), Scope(a))
	}
}
