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
