package api

// SandboxLocation is GET /moved-sandboxes/{id}, a fence extension of
// cluster nodes whose sandboxes move through the cluster's registry: where
// a sandbox moved off its node (a drained one) is now. Node is the node
// that took it over, "" while it waits in the registry for the next
// connect or resume (Waiting). A sandbox never moved answers 404.
type SandboxLocation struct {
	SandboxID string `json:"sandboxID"`
	Node      string `json:"node,omitempty"`
	Waiting   bool   `json:"waiting,omitempty"`
}
