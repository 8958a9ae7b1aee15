package cli

import (
	"context"
	"reflect"
	"strings"
	"testing"

	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/router"
)

// fence serve --registry parses into the daemon's Config with the content
// registry's own credentials, and is refused without --database.
func TestServeRegistryFlags(t *testing.T) {
	var got fencedaemon.Config
	deps := Deps{Serve: func(ctx context.Context, c fencedaemon.Config) error { got = c; return nil }}
	t.Setenv("FENCE_REGISTRY_USERNAME", "image-pulls")
	t.Setenv("FENCE_REGISTRY_PASSWORD", "not-these")
	t.Setenv(envContentRegistryUser, "fence")
	t.Setenv(envContentRegistryPassword, "pw")
	db := []string{"serve", "--database", "postgres://fence@db/fence", "--secrets-key", "/k"}
	code, _, stderr := execute(t, deps, "", append(db, "--registry", "registry.example/fence", "--registry-ca", "/ca.pem")...)
	want := &fencedaemon.RegistryOptions{URL: "registry.example/fence", CAFile: "/ca.pem", Username: "fence", Password: "pw"}
	if code != 0 || !reflect.DeepEqual(got.Registry, want) {
		t.Errorf("fence serve --registry = %d (%q), %+v; want %+v", code, stderr, got.Registry, want)
	}
	if code, _, _ := execute(t, deps, "", db...); code != 0 || got.Registry != nil {
		t.Errorf("fence serve without --registry = %d, %+v; want no registry", code, got.Registry)
	}
	for _, bad := range [][]string{
		{"serve", "--registry", "registry.example/fence"},
		{"serve", "--registry-ca", "/ca.pem"},
	} {
		got = fencedaemon.Config{}
		code, _, stderr := execute(t, deps, "", bad...)
		if code != 2 || !strings.Contains(stderr, "--registry") || got.Addr != "" {
			t.Errorf("fence %v = %d, %q; want a usage error naming --registry, and no serve", bad, code, stderr)
		}
	}
	t.Setenv(envContentRegistryPassword, "")
	if code, _, _ := execute(t, deps, "", append(db, "--registry", "registry.example/fence")...); code != 2 {
		t.Errorf("fence serve --registry with a username and no password = %d, want 2", code)
	}
}

func TestRouterSharedRegistryFlag(t *testing.T) {
	var got router.Config
	deps := Deps{Router: func(ctx context.Context, c router.Config) error { got = c; return nil }}
	t.Setenv("FENCE_API_KEY", "e2b_abc")
	t.Setenv("FENCE_CLUSTER_TOKEN", "tok")
	if code, _, stderr := execute(t, deps, "", "router", "--in-cluster", "--shared-database", "--shared-registry"); code != 0 || !got.SharedContent || !got.SharedRecords {
		t.Errorf("fence router --shared-registry = %d (%q), %+v", code, stderr, got)
	}
}
