// Package integration holds fence's end-to-end tests: they build (or take
// $FENCE_BIN) the real fence binary, start `fence serve` on a fresh data
// dir, and drive it through the Go SDK, raw HTTP and the CLI, asserting
// both the answers and what is left on the host afterwards (processes,
// cgroups, mounts, state directories).
//
// The tests need root (namespaces, cgroups, loop mounts) and the minimal
// template; the base template is used where a test needs python3 and is
// skipped when missing outside CI. Templates come from
// $FENCE_TEST_TEMPLATES (see internal/testutil).
//
// Each daemon's native backend instance is named after its data dir
// (serve-<hash>), so daemons of different tests never touch each other's
// sandboxes; TestTwoDaemons proves it.
package integration
