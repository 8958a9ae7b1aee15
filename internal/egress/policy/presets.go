package policy

// Presets are the allowOut shorthands for the package registries: "@pypi"
// in allowOut allows every name its preset lists. The egress gateway also
// uses them to recognise the downloads it records.
var Presets = map[string][]string{
	"@pypi":   {"pypi.org", "files.pythonhosted.org"},
	"@npm":    {"registry.npmjs.org", "registry.yarnpkg.com"},
	"@debian": {"deb.debian.org", "security.debian.org", "archive.ubuntu.com", "*.archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com"},
	"@go":     {"proxy.golang.org", "sum.golang.org", "index.golang.org"},
	"@crates": {"crates.io", "index.crates.io", "static.crates.io"},
	"@github": {"github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com", "release-assets.githubusercontent.com", "raw.githubusercontent.com"},
}

// PresetOf returns the preset ("@pypi", ...) whose names cover name, or "".
func PresetOf(name string) string {
	n, ok := NormalizeName(name)
	if !ok {
		return ""
	}
	for preset, names := range Presets {
		for _, pat := range names {
			if MatchPattern(pat, n) {
				return preset
			}
		}
	}
	return ""
}

// MatchPattern reports whether the normalised name matches pattern: an
// exact name, "*.suffix" for any name below suffix (not suffix itself), or
// "*" for every name.
func MatchPattern(pattern, name string) bool {
	if pattern == "*" {
		return name != ""
	}
	if suffix, ok := cutWild(pattern); ok {
		return len(name) > len(suffix)+1 && name[len(name)-len(suffix)-1] == '.' && name[len(name)-len(suffix):] == suffix
	}
	return pattern == name
}

func cutWild(p string) (string, bool) {
	if len(p) > 2 && p[0] == '*' && p[1] == '.' {
		return p[2:], true
	}
	return "", false
}
