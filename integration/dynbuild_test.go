package integration

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDynamicBuildRefused builds fence the ordinary way with cgo on (plain
// `go build` where a C compiler exists) and checks that `fence run` and
// `fence serve` refuse to start with an error that says how to build it,
// instead of sandboxes failing with "executing agent: no such file or
// directory"; and that the refusal changes nothing on disk.
func TestDynamicBuildRefused(t *testing.T) {
	requireTemplate(t, "minimal")
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("a C compiler is needed to build a dynamically linked fence: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "fence-dynamic")
	build := exec.Command("go", "build", "-o", bin, "./cmd/fence")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with cgo: %v: %s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	dynamic := false
	for _, p := range f.Progs {
		dynamic = dynamic || p.Type == elf.PT_INTERP
	}
	f.Close()
	if !dynamic {
		t.Fatalf("go build with CGO_ENABLED=1 produced a static binary: the test proves nothing")
	}
	const want = "CGO_ENABLED=0 go build -o bin/fence ./cmd/fence"
	for _, args := range [][]string{
		{"run", "--templates-dir", templatesDir(t), "--", "echo", "hello"},
		{"serve", "--addr", "127.0.0.1:0"},
	} {
		dataDir := filepath.Join(dir, "data-"+args[0])
		args = append(args[:1:1], append([]string{"--data-dir", dataDir}, args[1:]...)...)
		// A daemon that starts serves until killed: 30s is ample for a
		// refusal at start, which comes before anything is made.
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut {
			t.Errorf("dynamic fence %v: %v (stdout %q), want a refusal", args, err, stdout.String())
			continue
		}
		if !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "dynamically linked") {
			t.Errorf("dynamic fence %v: stderr %q, want it to say it is dynamically linked and how to build: %s", args, stderr.String(), want)
		}
		if strings.Contains(stdout.String(), "hello") {
			t.Errorf("dynamic fence %v ran the command: %q", args, stdout.String())
		}
		if _, err := os.Stat(dataDir); err == nil && args[0] == "serve" {
			t.Errorf("dynamic fence serve created its data dir before refusing")
		}
	}
}
