package daemon

import (
	"os"
	"path/filepath"
	"testing"
)

// realPath spells a data dir the kernel's way: symlinks followed in the
// part that exists, the rest kept, relative paths made absolute.
func TestRealPath(t *testing.T) {
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(base, "disk", "fence")
	if err := os.MkdirAll(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(filepath.Join("disk", "fence"), link); err != nil {
		t.Fatal(err)
	}
	t.Chdir(base)
	for _, tc := range []struct{ in, want string }{
		{real, real},
		{link, real},
		{"link", real},
		{filepath.Join(link, "templates"), filepath.Join(real, "templates")},
		{filepath.Join(link, "not", "yet"), filepath.Join(real, "not", "yet")},
		{filepath.Join(link, "..", "link"), real},
	} {
		if got, err := realPath(tc.in); err != nil || got != tc.want {
			t.Errorf("realPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	data, tmpl, err := resolveDirs(link, "")
	if err != nil || data != real || tmpl != filepath.Join(real, "templates") {
		t.Errorf("resolveDirs(%q, \"\") = %q, %q, %v; want %q and its templates", link, data, tmpl, err, real)
	}
}
