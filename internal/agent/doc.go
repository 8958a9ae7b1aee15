// Package agent is the fence agent: the first process inside every sandbox.
//
// It speaks E2B envd's protocol (Connect services process.Process and
// filesystem.Filesystem, plus the /files and /health HTTP routes) on a
// listener handed to it by the backend, so the daemon can forward the
// unmodified E2B SDK's traffic to it.
//
// # Security
//
// The agent runs inside the sandbox and is not trusted by the daemon: it makes
// no security decision on the daemon's behalf. The daemon authenticates every
// request (access tokens, signed URLs) before forwarding it. The agent only
// enforces what the sandbox's own kernel view enforces (users, permissions).
package agent
