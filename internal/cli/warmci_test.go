package cli

import (
	"context"
	"reflect"
	"strings"
	"testing"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
)

// fence serve keeps one code-interpreter sandbox warm when the template is
// built, unless --warm-code-interpreter 0; --warm-template naming the
// template (or its alias) takes precedence; a count out of range is
// refused and nothing is served.
func TestWarmCodeInterpreterFlag(t *testing.T) {
	t.Setenv("FENCE_API_KEY", "e2b_abc")
	ci := fencedaemon.WarmTemplate{Name: "code-interpreter", Size: 1, IfBuilt: true}
	for _, c := range []struct {
		args []string
		want []fencedaemon.WarmTemplate
	}{
		{nil, []fencedaemon.WarmTemplate{ci}},
		{[]string{"--warm-code-interpreter", "3"}, []fencedaemon.WarmTemplate{{Name: "code-interpreter", Size: 3, IfBuilt: true}}},
		{[]string{"--warm-code-interpreter", "0"}, nil},
		{[]string{"--warm-template", "code-interpreter-v1=2"}, []fencedaemon.WarmTemplate{{Name: "code-interpreter-v1", Size: 2}}},
		{[]string{"--warm-template", "base=2"}, []fencedaemon.WarmTemplate{{Name: "base", Size: 2}, ci}},
	} {
		var got *fencedaemon.Config
		deps := Deps{Serve: func(ctx context.Context, o fencedaemon.Config) error { got = &o; return nil }}
		if code, _, stderr := execute(t, deps, "", append([]string{"serve"}, c.args...)...); code != 0 {
			t.Fatalf("fence serve %v = %d, %s", c.args, code, stderr)
		}
		if !reflect.DeepEqual(got.WarmTemplates, c.want) {
			t.Errorf("fence serve %v: warm templates %+v, want %+v", c.args, got.WarmTemplates, c.want)
		}
	}
	served := false
	deps := Deps{Serve: func(context.Context, fencedaemon.Config) error { served = true; return nil }}
	if code, _, stderr := execute(t, deps, "", "serve", "--warm-code-interpreter", "-1"); code == 0 || served || !strings.Contains(stderr, "warm-code-interpreter") {
		t.Errorf("fence serve --warm-code-interpreter -1 = %d (served %v), %q; want a refusal naming the flag", code, served, stderr)
	}
}
