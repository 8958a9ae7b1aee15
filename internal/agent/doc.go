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
//
// # Layout
//
//   - process: the process.Process service (exec, PTY, stdin, signals,
//     output fan-out with bounded queues, exit retention) and the child
//     reaper (the agent is PID 1, so it reaps every orphan).
//   - fs: the filesystem.Filesystem service, watchers and the /files
//     routes (streaming uploads, gzip both ways, xattr metadata).
//   - users: Basic-auth username → Unix user, envd's path resolution.
//
// Serve and NewHandler wire them onto one http.Handler. Serve also starts
// the services a template declares in ServicesFile (the code-interpreter
// server), as the sandbox's processes, and restarts them when they exit.
package agent
