package nsinit

import (
	"slices"
	"testing"

	"github.com/fencesandbox/fence/internal/seccomp"
)

// The filter the daemon compiles is the filter init installs, bit for bit.
func TestFilterEncoding(t *testing.T) {
	prog, err := seccomp.Program()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeFilter(EncodeFilter(prog))
	if err != nil || !slices.Equal(got, prog) {
		t.Fatalf("decode(encode(prog)) = %d instructions, %v; want the %d of prog", len(got), err, len(prog))
	}
	for _, bad := range [][]byte{nil, {1, 2, 3}, make([]byte, 12)} {
		if _, err := DecodeFilter(bad); err == nil {
			t.Errorf("DecodeFilter(%d bytes) succeeded, want an error", len(bad))
		}
	}
}
