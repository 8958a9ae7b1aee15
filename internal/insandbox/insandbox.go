// Package insandbox holds the roles the fence binary plays inside a
// sandbox: the native backend's init (`fence init`), the agent that runs as
// the sandbox's PID 1 (`fence agent`), fence's sudo (the binary run as
// `sudo`), the attack probes of `fence selftest` (`fence probe`), the
// client of fence bench's network measure (`fence bench-client`) and the
// MCP gateway of the mcp-gateway template (`mcp-gateway`, package
// mcpgateway); and,
// on the host, the native backend's spawner, which clones every sandbox's
// init and whose memory every clone copies (package spawnrole).
//
// Two binaries play them: the fence binary itself, and the in-sandbox
// binary (cmd/fence-sandbox), which links only this package and what it
// needs. Every sandbox start runs two processes of the in-sandbox binary
// (init, then the agent), and a Go program pays at start for every
// package it links: the in-sandbox binary is a third of the fence
// binary's size and starts in about half the time. The fence binary
// carries the in-sandbox binary (package embedded) when it is built with
// scripts/build.sh; a fence binary built without it runs itself in its
// sandboxes, slower to start and otherwise the same.
//
// # Guarantees
//
//   - Main handles exactly the roles above, for both binaries, with the
//     same code.
//   - This package links nothing of the daemon's (no HTTP API, store,
//     network stack, Kubernetes client) nor of the isolation backends that
//     start it; TestImportDirection (cmd/fence) keeps it so.
package insandbox

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/fencesandbox/fence/internal/agent/sudo"
	"github.com/fencesandbox/fence/internal/insandbox/mcpgateway"
	"github.com/fencesandbox/fence/internal/insandbox/netclient"
	"github.com/fencesandbox/fence/internal/insandbox/spawnrole"
	"github.com/fencesandbox/fence/internal/selftest/probe"
)

// Roles are the first arguments Main takes (argv[1]); argv[0] "sudo" is
// fence's sudo.
var Roles = []string{"init", "agent", "probe", "bench-client", "mcp-gateway"}

// Main runs the role args name (os.Args) and returns the process's exit
// code; ok is false when args name no in-sandbox role.
func Main(args []string) (code int, ok bool) {
	if len(args) > 0 && filepath.Base(args[0]) == "sudo" {
		return sudo.Main(args[1:], os.Stdin, os.Stdout, os.Stderr), true
	}
	// The mcp-gateway template links /usr/local/bin/mcp-gateway here.
	if len(args) > 0 && filepath.Base(args[0]) == "mcp-gateway" {
		return mcpgateway.Main(args[1:], os.Stderr), true
	}
	if len(args) < 2 {
		return 0, false
	}
	if len(args) == 2 && args[1] == spawnrole.Arg {
		spawnrole.Serve() // never returns
	}
	switch args[1] {
	case "init":
		if err := RunInit(); err != nil {
			fmt.Fprintln(os.Stderr, "fence init:", err)
			return 1, true
		}
		return 0, true
	case "agent":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		if err := RunAgent(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "fence agent:", err)
			return 1, true
		}
		return 0, true
	case "probe":
		return probe.Main(args[2:], os.Stdout), true
	case "mcp-gateway":
		return mcpgateway.Main(args[2:], os.Stderr), true
	case "bench-client":
		if err := netclient.Main(args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fence bench-client:", err)
			return 1, true
		}
		return 0, true
	}
	return 0, false
}
