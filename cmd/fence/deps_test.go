package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportDirection checks the dependency rules of docs/ARCHITECTURE.md:
// the public surface (api/, client/) imports nothing internal, the router
// and the daemon share only the wire contract, and the in-sandbox agent
// links none of the daemon's control plane.
func TestImportDirection(t *testing.T) {
	const mod = "github.com/fencesandbox/fence/"
	rules := []struct {
		pkg    string
		banned []string
		// stdlib: every dependency but pkg itself is in the standard library.
		stdlib bool
	}{
		// The wire contract is imported by every side and by SDK users'
		// programs: it links the standard library alone.
		{pkg: "api", stdlib: true},
		// The public surface stands on its own: the wire contract below
		// the Go SDK, neither of them on fence's internals.
		{pkg: "api/...", banned: []string{mod + "internal/", mod + "client"}},
		{pkg: "client/...", banned: []string{mod + "internal/"}},
		// The agent shares only its boot contract (internal/agent/boot)
		// with the backends that start it, and stands below the isolation
		// seam it runs behind: the seam, the network stack, resolver and
		// TUN code stay out of it.
		{pkg: "internal/agent/...", banned: []string{
			mod + "internal/isolation",
			mod + "internal/daemon", mod + "internal/httpapi", mod + "internal/store",
			mod + "internal/sandbox", mod + "internal/egress/dns", mod + "internal/egress/tun",
			mod + "internal/egress/sniff", "gvisor.dev/", mod + "client",
			mod + "internal/cluster", "k8s.io/",
		}},
		// The cluster layer knows Kubernetes and the isolation seam, never
		// the daemon or its API.
		{pkg: "internal/cluster", banned: []string{mod + "internal/daemon", mod + "internal/httpapi", mod + "internal/router"}},
		// The domain core is below its HTTP API and knows no backend by
		// name. It reaches a sandbox's agent only through startup.Agent,
		// which the daemon wires: the Go SDK is not a part of the core.
		{pkg: "internal/sandbox", banned: []string{mod + "internal/httpapi", mod + "internal/daemon", mod + "internal/isolation/native",
			mod + "client", mod + "internal/router"}},
		// A create walks down, never back up into the lifecycle core: the
		// backends attach a sandbox's network to the isolation.Network
		// they are handed, and the network side (fences) reaches the core
		// only through the interface it declares.
		{pkg: "internal/isolation/...", banned: []string{mod + "internal/sandbox", mod + "internal/daemon", mod + "internal/httpapi"}},
		{pkg: "internal/sandbox/fences", banned: []string{mod + "internal/sandbox$", mod + "internal/daemon", mod + "internal/httpapi"}},
		// A template's start (internal/sandbox/startup) is walked by every
		// create: it never calls back up into the core.
		{pkg: "internal/sandbox/startup", banned: []string{mod + "internal/sandbox$", mod + "internal/httpapi", mod + "internal/daemon",
			mod + "client"}},
		// The daemon's HTTP API does not know whether a router stands in
		// front of it.
		{pkg: "internal/httpapi", banned: []string{mod + "internal/daemon", mod + "internal/isolation/native", mod + "internal/router"}},
		// fence router shares only the wire contract (api: routing, sandbox
		// IDs, page tokens) with the daemons behind it and finds them
		// through the cluster layer; it holds no sandbox and serves no
		// daemon route, so none of the daemon's packages is linked in.
		{pkg: "internal/router", banned: []string{mod + "internal/httpapi", mod + "internal/sandbox", mod + "internal/daemon",
			mod + "internal/store", mod + "client"}},
		// Every package linked into a binary is initialised at each of its
		// starts: the typed Kubernetes clientset and its informers register
		// every API group and doubled the cost of a start of fence.
		{pkg: "cmd/fence", banned: []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers"}},
		// The roles played inside a sandbox stand below what measures or
		// starts them: the bench client, the native backend's init and its
		// spawner are the in-sandbox binary's parts, and fence bench and
		// the native backend import them, not the other way round.
		{pkg: "internal/insandbox/...", banned: []string{mod + "internal/bench", mod + "internal/isolation"}},
		// A sandbox's network fence and the backends that attach to it
		// share only their contract (netattach, on the standard library
		// alone): the fence knows nothing of the isolation seam, which
		// imports it through fake, gvisor and the conformance suite.
		{pkg: "internal/netattach", stdlib: true},
		{pkg: "internal/netfence", banned: []string{mod + "internal/isolation"}},
		// The in-sandbox binary starts twice on every sandbox's create
		// (init, then the agent): it links the roles played inside a
		// sandbox and nothing of the daemon's.
		{pkg: "cmd/fence-sandbox", banned: []string{
			mod + "internal/daemon", mod + "internal/httpapi", mod + "internal/store",
			mod + "internal/sandbox", mod + "internal/egress$", mod + "internal/egress/dns",
			mod + "internal/egress/tun", mod + "internal/egress/sniff", mod + "internal/netfence",
			mod + "internal/isolation", mod + "internal/cli",
			mod + "internal/bench$", mod + "internal/audit", mod + "internal/cluster", mod + "client",
			"gvisor.dev/", "k8s.io/", "modernc.org/", "github.com/spf13/", "github.com/prometheus/",
			"github.com/google/go-containerregistry", "github.com/miekg/",
		}},
	}
	for _, r := range rules {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", "../../"+r.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", r.pkg, err, out)
		}
		for line := range strings.Lines(string(out)) {
			dep, std, _ := strings.Cut(strings.TrimSpace(line), " ")
			if r.stdlib && std != "true" && dep != mod+r.pkg {
				t.Errorf("%s depends on %s (only the standard library is allowed)", r.pkg, dep)
			}
			for _, b := range r.banned {
				exact, ok := strings.CutSuffix(b, "$") // "$": the package alone
				if dep == exact || !ok && strings.HasPrefix(dep, strings.TrimSuffix(b, "/")+"/") {
					t.Errorf("%s depends on %s (banned: %s)", r.pkg, dep, b)
				}
			}
		}
	}
}
