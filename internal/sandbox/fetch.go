package sandbox

import "context"

// Fetcher is implemented by Templates that may have to bring a template to
// this node before a create can use it (a cluster's template built on
// another node, pulled from the cluster's content registry): Fetch runs
// first in a create from a template, acting for the create's principal.
// A name it does not know is not an error (resolution answers for it).
type Fetcher interface {
	Fetch(ctx context.Context, name string) error
}
