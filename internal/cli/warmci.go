package cli

import fencedaemon "github.com/fencesandbox/fence/internal/daemon"

// codeInterpreterTemplate is the template the official code-interpreter
// SDK creates by default (code-interpreter-v1 is its alias).
const codeInterpreterTemplate = "code-interpreter"

// withCodeInterpreterPool adds to wts a warm pool of one code-interpreter
// sandbox (its kernel started and warm), kept only when the template is
// built, unless the default pool is off (warmPool 0) or wts names the
// template already (its size then is the one asked for).
func withCodeInterpreterPool(wts []fencedaemon.WarmTemplate, warmPool int) []fencedaemon.WarmTemplate {
	if warmPool <= 0 {
		return wts
	}
	for _, wt := range wts {
		if wt.Name == codeInterpreterTemplate || wt.Name == codeInterpreterTemplate+"-v1" {
			return wts
		}
	}
	return append(wts, fencedaemon.WarmTemplate{Name: codeInterpreterTemplate, Size: 1, IfBuilt: true})
}
