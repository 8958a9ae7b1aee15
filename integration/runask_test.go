package integration

import (
	"strings"
	"testing"
)

// TestRunAsk: `fence run --ask` holds the sandbox's lookup of a name it
// may not reach and asks on fence's stdin; the answer decides whether the
// request reaches the fake internet. Without --ask the name is refused
// unasked. Root: `fence run` makes the sandbox's namespaces.
func TestRunAsk(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	dataDir := newDataDir(t)
	run := func(t *testing.T, stdin string, ask bool, path string) (string, int) {
		t.Helper()
		args := []string{"run", "--data-dir", dataDir, "--templates-dir", templatesDir(t), "--template", "base",
			"--dns-upstream", fn.DNS.Addr}
		if ask {
			args = append(args, "--ask")
		}
		args = append(args, "--", "curl", "-sS", "--max-time", "20", "http://allowed.test"+path)
		_, errs, code := runFence(t, nil, strings.NewReader(stdin), args...)
		return errs, code
	}
	reached := func(m int, path string) bool {
		for _, l := range fn.since(m) {
			if strings.Contains(l, "path="+path) {
				return true
			}
		}
		return false
	}
	const prompt = "the sandbox looks up allowed.test: allow [o]nce, for this [s]andbox, or [d]eny?"

	t.Run("once", func(t *testing.T) {
		m := fn.mark()
		errs, code := run(t, "o\n", true, "/ask-once")
		if code != 0 || !strings.Contains(errs, prompt) || !reached(m, "/ask-once") {
			t.Errorf("answered o: exit %d, stderr %q, wan %q; want the prompt and the request through", code, errs, fn.since(m))
		}
	})
	t.Run("deny", func(t *testing.T) {
		m := fn.mark()
		errs, code := run(t, "d\n", true, "/ask-deny")
		if code == 0 || !strings.Contains(errs, prompt) || reached(m, "/ask-deny") {
			t.Errorf("answered d: exit %d, stderr %q, wan %q; want the prompt and no request", code, errs, fn.since(m))
		}
	})
	t.Run("end of input", func(t *testing.T) {
		m := fn.mark()
		errs, code := run(t, "", true, "/ask-eof")
		if code == 0 || !strings.Contains(errs, "end of input") || reached(m, "/ask-eof") {
			t.Errorf("no answer: exit %d, stderr %q, wan %q; want a refusal", code, errs, fn.since(m))
		}
	})
	t.Run("without --ask", func(t *testing.T) {
		m := fn.mark()
		errs, code := run(t, "o\n", false, "/no-ask")
		if code == 0 || strings.Contains(errs, "looks up") || reached(m, "/no-ask") {
			t.Errorf("without --ask: exit %d, stderr %q, wan %q; want a refusal unasked", code, errs, fn.since(m))
		}
	})
}
