package cli

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/fencesandbox/fence/internal/isolation"
)

// resolvePath returns p made absolute, cleaned and with its symlinks
// resolved. The path must exist.
func resolvePath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// parseBind parses a -v value, HOSTPATH:PATH[:ro|:rw], and validates it:
// HOSTPATH must exist, and once its symlinks are resolved pass
// isolation.CheckBindSource with fence's dirs (the data dir and the
// templates dir); PATH must be absolute and not "/". The returned HostPath
// is the resolved path: the backend opens that one directory, without
// following a symlink, and checks it again.
func parseBind(spec string, fenceDirs ...string) (isolation.Bind, error) {
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return isolation.Bind{}, usagef("invalid -v %q: want HOSTPATH:PATH[:ro]", spec)
	}
	b := isolation.Bind{Path: filepath.Clean(parts[1])}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			b.ReadOnly = true
		case "rw":
		default:
			return isolation.Bind{}, usagef("invalid -v %q: mode must be ro or rw, not %q", spec, parts[2])
		}
	}
	if !filepath.IsAbs(parts[1]) || b.Path == "/" {
		return isolation.Bind{}, usagef("invalid -v %q: sandbox path must be absolute and not /", spec)
	}
	host, err := resolvePath(parts[0])
	if err != nil {
		return isolation.Bind{}, fmt.Errorf("invalid -v %q: host path: %w", spec, err)
	}
	if err := isolation.CheckBindSource(host, b.ReadOnly, fenceDirs...); err != nil {
		if abs, _ := filepath.Abs(parts[0]); abs != host {
			return isolation.Bind{}, fmt.Errorf("invalid -v %q (%s resolves to %s): %w", spec, parts[0], host, err)
		}
		return isolation.Bind{}, fmt.Errorf("invalid -v %q: %w", spec, err)
	}
	b.HostPath = host
	return b, nil
}

// parseEnv parses -e values, K=V each.
func parseEnv(vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, "\x00") || strings.ContainsRune(v, 0) {
			return nil, usagef("invalid -e %q: want KEY=VALUE (the caller's environment is never passed in)", kv)
		}
		env[k] = v
	}
	return env, nil
}

// parsePairs parses repeated k=v flag values (metadata).
func parsePairs(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("invalid --%s %q: want KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}
