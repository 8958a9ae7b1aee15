package cli

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is an io.Writer safe for the prompter and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitOutput waits until out holds n occurrences of s.
func waitOutput(t *testing.T, out *lockedBuffer, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(out.String(), s) < n {
		if time.Now().After(deadline) {
			t.Fatalf("output %q: want %d × %q", out.String(), n, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestTerminalAsker(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in, answers := io.Pipe()
	out := &lockedBuffer{}
	a := newTerminalAsker(ctx, in, out, 0)

	ask := func(name, answer string) bool {
		t.Helper()
		got := make(chan bool, 1)
		go func() { got <- a.Ask(ctx, name) }()
		waitOutput(t, out, "looks up "+name+":", 1)
		if _, err := io.WriteString(answers, answer); err != nil {
			t.Fatal(err)
		}
		return <-got
	}
	if !ask("once.test", "what?\no\n") {
		t.Error("answered o: refused")
	}
	if !strings.Contains(out.String(), "answer o (once)") || !strings.Contains(out.String(), "once.test: allowed once\n") {
		t.Errorf("a bad answer was not asked again: %q", out.String())
	}
	if !ask("sandbox.test", "s\n") {
		t.Error("answered s: refused")
	}
	// Approved for this sandbox: no second prompt.
	if !a.Ask(ctx, "sandbox.test") || strings.Count(out.String(), "looks up sandbox.test") != 1 {
		t.Errorf("sandbox.test asked again after s: %q", out.String())
	}
	if ask("deny.test", "d\n") {
		t.Error("answered d: allowed")
	}
	// once.test was approved once only: it is asked again.
	if ask("once.test", "d\n") {
		t.Error("once.test allowed again without being asked")
	}

	// The end of input refuses the pending request and every later one.
	got := make(chan bool, 1)
	go func() { got <- a.Ask(ctx, "eof.test") }()
	waitOutput(t, out, "looks up eof.test:", 1)
	answers.Close()
	if <-got {
		t.Error("eof.test allowed after the end of input")
	}
	waitOutput(t, out, "end of input", 1)
	if a.Ask(ctx, "later.test") {
		t.Error("later.test allowed after the end of input")
	}
}

func TestTerminalAskerTimeout(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in, answers := io.Pipe()
	defer answers.Close()
	out := &lockedBuffer{}
	a := newTerminalAsker(ctx, in, out, 10*time.Millisecond)
	if a.Ask(ctx, "slow.test") {
		t.Error("an unanswered request was allowed")
	}
	waitOutput(t, out, "slow.test: no answer in time, refused", 1)
}

func TestParseAnswer(t *testing.T) {
	for in, want := range map[string]string{"o": "once", " ONCE ": "once", "s": "sandbox", "d": "deny", "no": "deny"} {
		if d, ok := parseAnswer(in); !ok || string(d) != want {
			t.Errorf("parseAnswer(%q) = %q, %v; want %s", in, d, ok, want)
		}
	}
	for _, in := range []string{"", "team", "yes please"} {
		if _, ok := parseAnswer(in); ok {
			t.Errorf("parseAnswer(%q) accepted", in)
		}
	}
}
