package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
)

// realPath returns p absolute and as the kernel resolves it: every symlink
// of the part of p that exists followed (the rest, which does not exist
// yet, is kept as given). A data dir reached through a symlink (say
// /var/lib/fence on a bigger disk) is then spelled one way only, the one
// /proc/self/mountinfo, the loop devices' backing files and runsc's mount
// checks see, so every path derived from it compares, mounts and unmounts
// as the kernel does, and every spelling of one data dir is the same
// native instance (native.InstanceOf).
func realPath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", p, err)
	}
	rest := ""
	for d := abs; ; d = filepath.Dir(d) {
		r, err := filepath.EvalSymlinks(d)
		if err == nil {
			return filepath.Join(r, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			return "", fmt.Errorf("resolving %s: %w", p, err)
		}
		rest = filepath.Join(filepath.Base(d), rest)
	}
}

// resolveDirs resolves a data dir and its templates dir (empty means
// DATA-DIR/templates) once, with realPath, before anything derives a path
// from them.
func resolveDirs(dataDir, templatesDir string) (string, string, error) {
	data, err := realPath(dataDir)
	if err != nil {
		return "", "", fmt.Errorf("data dir: %w", err)
	}
	if templatesDir == "" {
		return data, filepath.Join(data, "templates"), nil
	}
	tmpl, err := realPath(templatesDir)
	if err != nil {
		return "", "", fmt.Errorf("templates dir: %w", err)
	}
	return data, tmpl, nil
}
