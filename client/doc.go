// Package client is the Go SDK for fence's E2B-compatible API.
//
// A Client talks to the control plane of a fence daemon (create, list, get,
// kill, time out and connect sandboxes). An Envd talks to the agent inside one
// sandbox with envd's protocol (processes over Connect with the JSON codec,
// files over /files and the Filesystem service). An Envd reaches the agent
// either through the daemon (Sandbox.Envd, which routes by the
// E2b-Sandbox-Id / E2b-Sandbox-Port headers) or over any connection given as
// an *http.Client (NewEnvd), which is how `fence run` reaches a sandbox that
// has no daemon.
//
// # Errors
//
// Control-plane failures are *Error values carrying the HTTP status and the
// body's {"code","message"}. Agent failures keep the *connect.Error in their
// chain. Both unwrap to the api sentinels (api.ErrNotFound, api.ErrConflict,
// …), so callers branch with errors.Is.
//
// # Concurrency
//
// Client, Sandbox and Envd are safe for concurrent use. A Process delivers
// its output to the writers it was started with from a single goroutine, in
// the order the agent sent it, and finishes delivering before Wait returns.
package client
