// Package fence is the root of the fence module: a self-hosted sandbox
// platform for AI agents with an E2B-compatible API. The binary is
// cmd/fence; the packages are under api/, client/ and internal/ (see
// docs/ARCHITECTURE.md). This package itself holds only repository-wide
// tests.
package fence
