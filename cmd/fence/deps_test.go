package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportDirection checks the dependency rules of docs/ARCHITECTURE.md:
// the public surface (api/, client/) imports nothing internal, and the
// in-sandbox agent links none of the daemon's control plane.
func TestImportDirection(t *testing.T) {
	const mod = "github.com/fencesandbox/fence/"
	rules := []struct {
		pkg    string
		banned []string
	}{
		{"api/...", []string{mod + "internal/"}},
		{"client/...", []string{mod + "internal/"}},
		// The agent shares only the isolation package's plain types with
		// the daemon (which reach egress/policy, pure and I/O-free); the
		// network stack, resolver and TUN code stay out of it.
		{"internal/agent/...", []string{
			mod + "internal/daemon", mod + "internal/httpapi", mod + "internal/store",
			mod + "internal/sandbox", mod + "internal/egress/dns", mod + "internal/egress/tun",
			mod + "internal/egress/sniff", "gvisor.dev/", mod + "client",
			mod + "internal/cluster", "k8s.io/",
		}},
		// The cluster layer knows Kubernetes and the isolation seam, never
		// the daemon or its API.
		{"internal/cluster", []string{mod + "internal/daemon", mod + "internal/httpapi", mod + "internal/router"}},
		{"internal/sandbox", []string{mod + "internal/httpapi", mod + "internal/daemon", mod + "internal/isolation/native"}},
		{"internal/httpapi", []string{mod + "internal/daemon", mod + "internal/isolation/native"}},
		// Every package linked into a binary is initialised at each of its
		// starts: the typed Kubernetes clientset and its informers register
		// every API group and doubled the cost of a start of fence.
		{"cmd/fence", []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/informers"}},
		// The in-sandbox binary starts twice on every sandbox's create
		// (init, then the agent): it links the roles played inside a
		// sandbox and nothing of the daemon's.
		{"cmd/fence-sandbox", []string{
			mod + "internal/daemon", mod + "internal/httpapi", mod + "internal/store",
			mod + "internal/sandbox", mod + "internal/egress$", mod + "internal/egress/dns",
			mod + "internal/egress/tun", mod + "internal/egress/sniff", mod + "internal/netfence",
			mod + "internal/isolation/native$", mod + "internal/isolation/gvisor", mod + "internal/cli",
			mod + "internal/bench$", mod + "internal/audit", mod + "internal/cluster", mod + "client",
			"gvisor.dev/", "k8s.io/", "modernc.org/", "github.com/spf13/", "github.com/prometheus/",
			"github.com/google/go-containerregistry", "github.com/miekg/",
		}},
	}
	for _, r := range rules {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "../../"+r.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", r.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range r.banned {
				exact, ok := strings.CutSuffix(b, "$") // "$": the package alone
				if dep == exact || !ok && strings.HasPrefix(dep, strings.TrimSuffix(b, "/")+"/") {
					t.Errorf("%s depends on %s (banned: %s)", r.pkg, dep, b)
				}
			}
		}
	}
}
