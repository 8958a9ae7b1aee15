package startup

import (
	"fmt"
	"testing"
)

// TestRunImagesBounded checks that at most maxRunImages images are kept,
// the oldest dropped first, and that a second image for a key is not kept.
func TestRunImagesBounded(t *testing.T) {
	r := NewImages(nil, nil)
	for i := range maxRunImages + 3 {
		dropped := r.put(fmt.Sprint("k", i), fmt.Sprint("l", i))
		if want := i >= maxRunImages; dropped != want {
			t.Errorf("put #%d dropped %v, want %v", i, dropped, want)
		}
	}
	if got := len(r.Layers()); got != maxRunImages {
		t.Errorf("%d images kept, want %d", got, maxRunImages)
	}
	if r.get("k0") != "" || r.get(fmt.Sprint("k", maxRunImages+2)) == "" {
		t.Errorf("the oldest image was not the one dropped")
	}
	if !r.put("k5", "other") || r.get("k5") != "l5" {
		t.Errorf("a second image for a key replaced the first")
	}
}
