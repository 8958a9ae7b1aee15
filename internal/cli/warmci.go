package cli

import (
	"fmt"

	"github.com/spf13/pflag"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
)

// codeInterpreterTemplate is the template the official code-interpreter
// SDK creates by default (code-interpreter-v1 is its alias).
const codeInterpreterTemplate = "code-interpreter"

// addWarmCodeInterpreterFlag adds --warm-code-interpreter to fs.
func addWarmCodeInterpreterFlag(fs *pflag.FlagSet, n *int) {
	fs.IntVar(n, "warm-code-interpreter", 1, "sandboxes of the code-interpreter template (their kernel started and warm) kept started ahead of creates that add no env vars, when the template is built; 0 disables (--warm-template code-interpreter=N takes precedence)")
}

// withCodeInterpreterPool adds to wts a warm pool of n code-interpreter
// sandboxes, kept only when the template is built, unless n is 0 or wts
// names the template already (its size then is the one asked for).
func withCodeInterpreterPool(wts []fencedaemon.WarmTemplate, n int) ([]fencedaemon.WarmTemplate, error) {
	if n < 0 || n > 64 {
		return nil, fmt.Errorf("--warm-code-interpreter %d: want 0 to 64", n)
	}
	if n == 0 {
		return wts, nil
	}
	for _, wt := range wts {
		if wt.Name == codeInterpreterTemplate || wt.Name == codeInterpreterTemplate+"-v1" {
			return wts, nil
		}
	}
	return append(wts, fencedaemon.WarmTemplate{Name: codeInterpreterTemplate, Size: n, IfBuilt: true}), nil
}
