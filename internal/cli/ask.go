package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/approvals"
)

// localSandboxID names the one sandbox of `fence run` in its approval queue.
const localSandboxID = "run"

// terminalAsker is network approval "ask" for `fence run --ask`: each
// lookup of a name the sandbox may not reach becomes a request of an
// approvals.Queue, prompted on out and answered by a line of in: once,
// for this sandbox (later lookups of the name proceed unasked), or deny.
// A request nobody answers before the queue's timeout is refused; once
// in ends, every request is.
type terminalAsker struct {
	q   *approvals.Queue
	out io.Writer

	mu sync.Mutex
	// allowed are the names approved for this sandbox.
	allowed map[string]bool
	// closed is set once in ended: nobody is left to ask.
	closed bool
}

// newTerminalAsker starts prompting for the requests of a new queue until
// ctx ends. timeout is how long a request waits for its answer (0: the
// queue's default).
func newTerminalAsker(ctx context.Context, in io.Reader, out io.Writer, timeout time.Duration) *terminalAsker {
	a := &terminalAsker{out: out, allowed: map[string]bool{}}
	a.q = approvals.New(approvals.Options{Timeout: timeout, Apply: func(_ context.Context, r approvals.Request) error {
		if r.Decision == approvals.Sandbox {
			a.mu.Lock()
			a.allowed[r.Name] = true
			a.mu.Unlock()
		}
		return nil
	}})
	events := a.q.Subscribe(ctx)
	lines := make(chan string)
	go func() {
		// This reader can outlive ctx while it waits for a line; the CLI
		// exits right after the run, so that costs nothing.
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
		close(lines)
	}()
	go a.prompt(ctx, events, lines)
	return a
}

// Ask holds a lookup of name until it is answered; it reports whether the
// lookup may proceed.
func (a *terminalAsker) Ask(ctx context.Context, name string) bool {
	a.mu.Lock()
	allowed, closed := a.allowed[name], a.closed
	a.mu.Unlock()
	if allowed {
		return true
	}
	if closed {
		return false
	}
	d, err := a.q.Ask(ctx, localSandboxID, "", name)
	return err == nil && d.Allows()
}

// prompt asks about the pending requests one at a time, oldest first.
func (a *terminalAsker) prompt(ctx context.Context, events <-chan approvals.Event, lines <-chan string) {
	for {
		pending := a.q.List(nil)
		if len(pending) == 0 {
			select {
			case <-events:
				continue
			case <-ctx.Done():
				return
			}
		}
		r := pending[0]
		fmt.Fprintf(a.out, "fence: the sandbox looks up %s: allow [o]nce, for this [s]andbox, or [d]eny? ", r.Name)
		for answered := false; !answered; {
			select {
			case <-ctx.Done():
				return
			case ev := <-events:
				if ev.Type == "decided" && ev.Request.ID == r.ID {
					fmt.Fprintf(a.out, "\nfence: %s: no answer in time, refused\n", r.Name)
					answered = true
				}
			case line, ok := <-lines:
				if !ok {
					a.endInput()
					fmt.Fprintf(a.out, "\nfence: no more answers (end of input): %s and every later name refused\n", r.Name)
					// An Ask that began before the end was seen is
					// refused as it arrives.
					for {
						select {
						case <-events:
							a.q.Drop(localSandboxID)
						case <-ctx.Done():
							return
						}
					}
				}
				d, ok := parseAnswer(line)
				if !ok {
					fmt.Fprint(a.out, "fence: answer o (once), s (for this sandbox) or d (deny): ")
					continue
				}
				if _, err := a.q.Decide(ctx, r.ID, d, "terminal", nil); err != nil {
					fmt.Fprintf(a.out, "fence: %s: too late, refused\n", r.Name)
				} else {
					fmt.Fprintf(a.out, "fence: %s: %s\n", r.Name, decided[d])
				}
				answered = true
			}
		}
	}
}

// endInput refuses the pending requests and every later one.
func (a *terminalAsker) endInput() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.q.Drop(localSandboxID)
}

// decided words a decision for the terminal.
var decided = map[approvals.Decision]string{approvals.Once: "allowed once", approvals.Sandbox: "allowed for this sandbox", approvals.Deny: "refused"}

// parseAnswer reads an answer to the prompt.
func parseAnswer(line string) (approvals.Decision, bool) {
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "o", "once":
		return approvals.Once, true
	case "s", "sandbox":
		return approvals.Sandbox, true
	case "d", "deny", "n", "no":
		return approvals.Deny, true
	}
	return "", false
}
