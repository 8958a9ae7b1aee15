package cli

import (
	"os"

	"github.com/spf13/pflag"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/router"
)

// Environment variables of the content registry's credentials (the
// FENCE_REGISTRY_… ones are the image pulls' credentials).
const (
	envContentRegistryUser     = "FENCE_CONTENT_REGISTRY_USERNAME"
	envContentRegistryPassword = "FENCE_CONTENT_REGISTRY_PASSWORD"
)

// registryFlags are `fence serve`'s --registry flags: the cluster's
// content registry, through which templates move between nodes.
type registryFlags struct {
	url, ca string
}

func (r *registryFlags) add(fs *pflag.FlagSet) {
	fs.StringVar(&r.url, "registry", "", "the cluster's content registry, HOST[:PORT]/PATH-PREFIX (HTTPS; plain HTTP only on a loopback address): templates built and snapshots taken on a node are pushed there and pulled by the others; needs --database; credentials from $"+envContentRegistryUser+" and $"+envContentRegistryPassword+"; see docs/CLUSTER.md")
	fs.StringVar(&r.ca, "registry-ca", "", "PEM file of CA certificates the content registry's TLS certificate may chain to, besides the system's")
}

// options returns the registry options, or nil without --registry.
func (r *registryFlags) options(database string) (*fencedaemon.RegistryOptions, error) {
	if r.url == "" {
		if r.ca != "" {
			return nil, usagef("--registry-ca needs --registry")
		}
		return nil, nil
	}
	if database == "" {
		return nil, usagef("--registry needs --database: the cluster's index of its templates is kept there")
	}
	o := &fencedaemon.RegistryOptions{URL: r.url, CAFile: r.ca,
		Username: os.Getenv(envContentRegistryUser), Password: os.Getenv(envContentRegistryPassword)}
	if (o.Username == "") != (o.Password == "") {
		return nil, usagef("$%s and $%s go together", envContentRegistryUser, envContentRegistryPassword)
	}
	return o, nil
}

// addRouterRegistryFlag adds `fence router --shared-registry`.
func addRouterRegistryFlag(fs *pflag.FlagSet, c *router.Config) {
	fs.BoolVar(&c.SharedContent, "shared-registry", false, "the nodes pull the templates they lack from one content registry (fence serve --registry): with --shared-database, a create may go to a node without its template")
}
