package httpapi

import "net/http"

// SandboxTarget reports whether r is sandbox traffic to a daemon whose
// sandbox domain is domain, and the sandbox ID and port it names, with the
// daemon's own rules (see Routing in the package doc). A request that
// names a sandbox badly is sandbox traffic with an error. fence router
// uses it to send sandbox traffic to the right node.
func SandboxTarget(r *http.Request, domain string) (id string, port int, ok bool, err error) {
	t, ok, err := (&handler{domain: domain}).sandboxTarget(r)
	return t.id, t.port, ok, err
}
