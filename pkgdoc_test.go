// Package fence_test holds repository-wide checks.
package fence_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocs requires exactly one package doc comment in every
// package directory (CONTRIBUTING.md, "Package docs state guarantees"),
// so that each package states what it does and what it guarantees.
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
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		// The package doc comments of each package in the directory, by
		// package name.
		docs := map[string]int{}
		fset := token.NewFileSet()
		for _, e := range entries {
			fname := e.Name()
			if e.IsDir() || !strings.HasSuffix(fname, ".go") || strings.HasSuffix(fname, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(path, fname), nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			if _, ok := docs[f.Name.Name]; !ok {
				docs[f.Name.Name] = 0
			}
			if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
				docs[f.Name.Name]++
			}
		}
		for pname, n := range docs {
			if n != 1 {
				t.Errorf("package %s in %s has %d package doc comments, want 1", pname, path, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
