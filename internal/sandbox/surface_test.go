package sandbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxManagerMethods bounds the Manager's methods, exported and not: what
// the lifecycle core does beyond its registry belongs to the types that
// own that state (Pauses, admission, the reaper, the adopter, the
// packages fences, timetravel, startup and usage).
const maxManagerMethods = 30

// TestManagerSurface keeps the Manager within maxManagerMethods methods.
func TestManagerSurface(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var methods []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
			if !ok {
				continue
			}
			if id, ok := ast.Unparen(star.X).(*ast.Ident); ok && id.Name == "Manager" {
				methods = append(methods, fn.Name.Name)
			}
		}
	}
	slices.Sort(methods)
	if len(methods) == 0 || len(methods) > maxManagerMethods {
		t.Errorf("*Manager has %d methods, want 1 to %d: %s", len(methods), maxManagerMethods, strings.Join(methods, ", "))
	}
}
