// Package fence_test holds repository-wide checks.
package fence_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs requires exactly one package doc comment in every
// package directory (STYLE rule 1), so that each package states what it
// does and what it guarantees.
func TestPackageDocs(t *testing.T) {
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin") {
			return filepath.SkipDir
		}
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, path, func(fi fs.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		for pname, p := range pkgs {
			docs := 0
			for _, f := range p.Files {
				if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
					docs++
				}
			}
			if docs != 1 {
				t.Errorf("package %s in %s has %d package doc comments, want 1", pname, path, docs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
