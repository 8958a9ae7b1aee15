// Package probe holds fence's attack probes: each check attempts one
// escape or privilege from inside a sandbox and reports whether the
// sandbox refused it. The fence binary runs them as the hidden role
// `fence probe CHECK [ARG...]` (it is mounted in every sandbox at
// /.fence/fence), for `fence selftest` and for the native backend's attack
// tests, so both exercise the same code.
//
// # Protocol
//
// A check prints one line and exits:
//
//   - "ok", exit 0: the attack was refused;
//   - "ESCAPE: <what worked>", exit 1: the sandbox let it through;
//   - "ERROR: <why>", exit 3: the probe could not carry out its attack (a
//     check that cannot run proves nothing, so this is a failure too);
//   - usage errors (no or unknown check, bad arguments) exit 2.
//
// A check with [Check.KilledBy] set passes only when the kernel kills the
// probe with that signal (seccomp's kill action, the OOM killer): if it
// returns at all, it prints ESCAPE.
//
// # What a pass proves
//
// Each [Check.Proves] states it. A probe judges what it sees from inside;
// where an in-sandbox failure alone could have another cause (a connect
// that fails because the host has no route, not because fence refused
// it), the host side adds its own evidence (see package selftest).
//
// The package has no state and imports nothing of fence's: it must run
// inside a sandbox as an unprivileged, filtered process.
package probe

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
)

// Check is one attack.
type Check struct {
	// Name is the check's name on the command line.
	Name string
	// Group is the layer the check attacks: identity, syscalls, sockets,
	// filesystems, devices, processes, network or limits.
	Group string
	// Proves says what a pass shows.
	Proves string
	// Args describes the arguments the check needs ("" when none).
	Args string
	// KilledBy, when non-zero, is the signal the kernel must end the probe
	// with for the check to pass.
	KilledBy syscall.Signal

	run func(args []string) error
}

// Checks returns every check, in the order `fence selftest` runs them: the
// cheap, side-effect-free ones first, the resource limits last.
func Checks() []Check {
	return append([]Check(nil), checks...)
}

// Lookup returns the check called name.
func Lookup(name string) (Check, bool) {
	for _, c := range checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// Exit codes of Main.
const (
	ExitRefused = 0 // the attack was refused ("ok")
	ExitEscaped = 1 // the attack worked ("ESCAPE: …")
	ExitUsage   = 2 // no, unknown or badly called check
	ExitError   = 3 // the probe could not run its attack ("ERROR: …")
)

// Escape is the error a check returns when its attack worked.
type Escape struct{ What string }

func (e *Escape) Error() string { return e.What }

func escapef(format string, args ...any) error {
	return &Escape{fmt.Sprintf(format, args...)}
}

// errUsage marks a badly called check.
var errUsage = errors.New("usage")

// Main runs the check args[0] with the rest of args as its arguments,
// prints its verdict line on out and returns the process exit code.
func Main(args []string, out io.Writer) int {
	if len(args) < 1 {
		fmt.Fprintln(out, "usage: fence probe CHECK [ARG...]; checks:", names())
		return ExitUsage
	}
	c, ok := Lookup(args[0])
	if !ok {
		fmt.Fprintf(out, "unknown check %q; checks: %s\n", args[0], names())
		return ExitUsage
	}
	err := c.run(args[1:])
	var esc *Escape
	switch {
	case err == nil:
		fmt.Fprintln(out, "ok")
		return ExitRefused
	case errors.As(err, &esc):
		fmt.Fprintln(out, "ESCAPE:", oneLine(esc.What))
		return ExitEscaped
	case errors.Is(err, errUsage):
		fmt.Fprintf(out, "%v; usage: fence probe %s %s\n", err, c.Name, c.Args)
		return ExitUsage
	default:
		fmt.Fprintln(out, "ERROR:", oneLine(err.Error()))
		return ExitError
	}
}

func names() string {
	var n []string
	for _, c := range checks {
		n = append(n, c.Name)
	}
	return strings.Join(n, " ")
}

func oneLine(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ")
}
