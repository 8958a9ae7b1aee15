package daemon

import (
	"testing"

	"github.com/fencesandbox/fence/internal/sandbox"
)

func TestManagerRefBeforeAndAfterBind(t *testing.T) {
	var r managerRef
	// Before the manager exists there is no sandbox to be about: usage is
	// dropped rather than a nil dereference.
	r.AddEgress("sb", 1, 2)
	r.bind(&sandbox.Manager{})
	defer func() {
		if recover() == nil {
			t.Fatal("a second bind did not panic")
		}
	}()
	r.bind(&sandbox.Manager{})
}
