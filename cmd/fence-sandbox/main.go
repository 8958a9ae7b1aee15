// Command fence-sandbox is the in-sandbox binary: the roles fence plays
// inside a sandbox (init, agent, sudo, probe, bench-client) and the native
// backend's spawner, which clones every sandbox's init, and nothing else,
// so that each sandbox start links and initializes as little as possible
// and each clone copies as little. The fence binary carries it (see
// scripts/build.sh and internal/insandbox/embedded); it is not meant to be
// run by hand.
package main

import (
	"fmt"
	"os"

	"github.com/fencesandbox/fence/internal/insandbox"
)

func main() {
	code, ok := insandbox.Main(os.Args)
	if !ok {
		fmt.Fprintf(os.Stderr, "fence-sandbox: the in-sandbox binary of fence; roles: %v\n", insandbox.Roles)
		os.Exit(2)
	}
	os.Exit(code)
}
