// Package cli implements fence's command-line verbs as a library: Root
// builds the cobra command tree and Run executes it. cmd/fence only wires
// the daemon, agent and backend entry points in through Deps, so this
// package imports no daemon internals; the client verbs speak to a daemon
// through package client, like any other SDK user.
//
// # Exit codes
//
// Run returns 0 on success, 1 for a failed command (the error is printed as
// "fence: <message>"), 2 for a usage error, and for `fence run` and
// `fence exec` the exit code of the command run in the sandbox (128+n when
// it was ended by signal n).
//
// # Environment
//
// Nothing is read from the environment when the tree is built. At run time
// the client verbs read FENCE_URL and FENCE_API_KEY as flag defaults, and
// `fence serve` reads FENCE_API_KEY. The caller's environment is never passed
// into a sandbox: only -e/--env values are.
package cli
