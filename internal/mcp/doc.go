// Package mcp serves fence sandboxes to AI agents as Model Context Protocol
// tools: create a sandbox, run a command in it, read, write and list its
// files, checkpoint, diff and rewind its filesystem, kill it, and list the
// sandboxes.
//
// The server is a client of a fence daemon's public API (package client)
// and of nothing else: `fence mcp` serves it over stdio to a daemon named
// by FENCE_URL, and the daemon serves it as streamable HTTP at /mcp
// (NewHTTPHandler) through an in-process connection to its own API
// (Loopback), so every call an agent makes goes through the same
// authentication, checks and audit trail as an SDK's.
//
// # Guarantees
//
//   - Every tool's input is validated against its JSON schema (listed by
//     tools/list) and then by the tool itself; a bad argument, a missing
//     sandbox or a failure of the daemon is answered as a tool error
//     (isError, with a message), never as a protocol error or a crash: a
//     panic in a tool is recovered into a tool error.
//   - A tool that fails on its input changes nothing.
//   - run_command returns the command's exit code (a non-zero code is a
//     result, not an error) and the last OutputCap bytes of its stdout and
//     stderr; when the call carried a progress token, the output is also
//     streamed, chunk by chunk and in order, as progress notifications
//     whose message is the chunk and whose progress is the number of
//     output bytes so far. A command still running at its timeout is
//     killed, and the result says so.
//   - read_file returns at most its max_bytes (ReadCap by default), as
//     text when the bytes are UTF-8, else base64.
//   - Over HTTP, a session acts with the API key of the request that
//     opened it, and refuses a request or notification that carries
//     another key.
package mcp
