package native_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// A sandbox describes its cgroups (what `fence bench` prints when a
// reading of a sandbox's use looks wrong), its agent among their
// processes, also when it waited as a ready init in a group of its own
// that its create renamed (cgroup v1).
func TestDescribeCgroups(t *testing.T) {
	b := newBackendWith(t, native.Options{ReadyInits: 1})
	sb := create(t, b, isolation.Spec{})
	d, ok := isolation.As[interface{ DescribeCgroups() string }](sb)
	if !ok {
		t.Fatal("a native sandbox does not describe its cgroups")
	}
	got := d.DescribeCgroups()
	t.Logf("DescribeCgroups():\n%s", got)
	pid := strconv.Itoa(native.AgentPid(sb))
	if !strings.Contains(got, "process "+pid+": ") || strings.Contains(got, native.ReadyGroup) {
		t.Errorf("DescribeCgroups() does not list the agent (%s) in the sandbox's groups", pid)
	}
}
