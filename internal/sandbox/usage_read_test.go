package sandbox

import (
	"context"
	"testing"
	"time"
)

// TestReadingAllocatesNothing: the usage readings of every live sandbox
// every few seconds share their round's context; a reading allocates
// nothing once its sandbox's ring of readings is full (it allocated a
// context and its timer each, a cost paid per sandbox alive).
func TestReadingAllocatesNothing(t *testing.T) {
	env := newEnv(t)
	s := env.mustCreate(t, CreateRequest{Timeout: time.Hour})
	e, err := env.m.lookup(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now()
	for range 720 { // the ring's length: full from here on
		if _, err := e.Read(ctx, now); err != nil {
			t.Fatalf("Read: %v", err)
		}
	}
	if allocs := testing.AllocsPerRun(50, func() {
		if _, err := e.Read(ctx, now); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("a reading allocated %.1f times, want 0", allocs)
	}
}
