package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/fencesandbox/fence/internal/isolation"
)

// forbiddenHostPaths are host trees never mounted into a sandbox.
var forbiddenHostPaths = []string{"/proc", "/sys", "/dev"}

// within reports whether p is dir or lies under it. Both are clean and
// absolute.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

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
// HOSTPATH must exist; after resolving symlinks it must not be the host's
// root, lie in /proc, /sys or /dev, be inside (or contain) dataDir, or be
// owned by root unless the bind is read-only (the native backend refuses
// it too, see native.ErrRootOwnedBind); PATH
// must be absolute and not "/". The returned HostPath is the resolved path.
func parseBind(spec, dataDir string) (isolation.Bind, error) {
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
	if host == "/" {
		return isolation.Bind{}, fmt.Errorf("invalid -v %q: refusing to mount the host's root", spec)
	}
	for _, f := range forbiddenHostPaths {
		if within(host, f) {
			return isolation.Bind{}, fmt.Errorf("invalid -v %q: refusing to mount %s (inside %s)", spec, host, f)
		}
	}
	data, err := resolvePath(dataDir)
	if err != nil {
		// A data dir that does not exist yet still must not be exposed.
		if data, err = filepath.Abs(dataDir); err != nil {
			return isolation.Bind{}, fmt.Errorf("resolving data dir: %w", err)
		}
	}
	if within(host, data) || within(data, host) {
		return isolation.Bind{}, fmt.Errorf("invalid -v %q: refusing to mount %s, which overlaps fence's data dir %s", spec, host, data)
	}
	if st, err := os.Stat(host); err == nil && !b.ReadOnly {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid == 0 {
			return isolation.Bind{}, fmt.Errorf("invalid -v %q: refusing a writable bind of %s, which is owned by root (its root-owned files would be the sandbox user's): bind it read-only (:ro)", spec, host)
		}
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
