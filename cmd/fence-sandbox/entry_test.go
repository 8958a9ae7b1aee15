package main

import (
	"testing"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
)

// The entry point keeps in an init's bounding set exactly what the init
// keeps.
func TestBoundingKeepIsTheInitsKeptSet(t *testing.T) {
	if got, want := uint64(boundingKeep), nsinit.KeptCaps(); got != want {
		t.Fatalf("boundingKeep = %#x, nsinit keeps %#x", got, want)
	}
}
