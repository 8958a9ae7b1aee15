package native

import (
	"debug/elf"
	"fmt"
)

// BuildCommand is how to build a fence binary that sandboxes can run.
const BuildCommand = "CGO_ENABLED=0 go build -o bin/fence ./cmd/fence"

// CheckExecutable returns an error unless path is an ELF executable that
// needs no program interpreter (dynamic loader). The fence binary runs inside every sandbox as its agent,
// and a template need not have a C library or a dynamic loader (minimal
// has none): a dynamically linked build (plain `go build` on a machine
// with a C compiler, where cgo is on) would fail there with "no such file
// or directory". The error says how to build it.
func CheckExecutable(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("fence binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("fence binary %s is dynamically linked (built with cgo on), "+
				"but it runs inside sandboxes, which have no C library or loader; "+
				"build it statically with: %s", path, BuildCommand)
		}
	}
	return nil
}
