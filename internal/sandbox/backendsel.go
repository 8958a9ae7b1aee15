package sandbox

import "github.com/fencesandbox/fence/internal/isolation"

// BackendMetadataKey is the create metadata key that picks the isolation
// backend of one sandbox ("native", "gvisor"); without it the daemon's
// default (fence serve --backend) is used. It is metadata so that E2B's
// SDKs, which pass metadata through unchanged, can set it; it stays in the
// sandbox's metadata like any other key.
const BackendMetadataKey = "fence.backend"

// backendFor returns the backend of b a create asks for: "" for the
// default. An unknown name is invalid input.
func backendFor(b isolation.Backend, req CreateRequest) (string, error) {
	name, ok := req.Metadata[BackendMetadataKey]
	if !ok || name == b.Name() {
		return "", nil
	}
	has := func(n string) bool { return false }
	if h, ok := isolation.As[interface{ Has(string) bool }](b); ok {
		has = h.Has
	}
	if name == "" || !has(name) {
		return "", invalid("metadata %s: backend %q is not available on this daemon (default %q)", BackendMetadataKey, name, b.Name())
	}
	return name, nil
}
