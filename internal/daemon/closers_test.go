package daemon

import (
	"slices"
	"testing"
)

func TestClosersRunInReverseOnce(t *testing.T) {
	var got []int
	var c closers
	for i := range 3 {
		c.push(func() { got = append(got, i) })
	}
	c.close()
	c.close()
	if want := []int{2, 1, 0}; !slices.Equal(got, want) {
		t.Fatalf("close ran %v, want %v", got, want)
	}
}

func TestClosersPushDuringClose(t *testing.T) {
	// A closer that pushes another (a late cleanup) has it run too.
	var got []string
	var c closers
	c.push(func() { got = append(got, "first") })
	c.push(func() {
		got = append(got, "second")
		c.push(func() { got = append(got, "late") })
	})
	c.close()
	if want := []string{"second", "late", "first"}; !slices.Equal(got, want) {
		t.Fatalf("close ran %v, want %v", got, want)
	}
}
