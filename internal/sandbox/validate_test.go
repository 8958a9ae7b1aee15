package sandbox

import (
	"errors"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// validate, on its own: a request that names nothing gets the defaults
// given, one that names its size gets it, and the longest timeout is the
// one given, not a Manager's.
func TestValidateDefaultsAndBounds(t *testing.T) {
	d := Defaults{Timeout: time.Minute}.withBuiltins()
	timeout, lim, err := validate(CreateRequest{TemplateID: "t"}, d, time.Hour)
	if err != nil || timeout != time.Minute || lim != d.Limits() {
		t.Errorf("validate(no size) = %v, %+v, %v; want %v, %+v", timeout, lim, err, time.Minute, d.Limits())
	}
	_, lim, err = validate(CreateRequest{TemplateID: "t", CPUs: 2, MemoryMB: 64, DiskMB: 10}, d, time.Hour)
	if err != nil || lim.CPUs != 2 || lim.MemoryBytes != 64<<20 || lim.DiskBytes != 10<<20 || lim.Pids != d.Pids {
		t.Errorf("validate(sized) = %+v, %v", lim, err)
	}
	if _, _, err := validate(CreateRequest{TemplateID: "t", Timeout: 2 * time.Hour}, d, time.Hour); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("validate(timeout past the bound) = %v, want ErrInvalidArgument", err)
	}
	for _, to := range []time.Duration{0, -time.Second, time.Hour + 1} {
		if err := checkTimeout(to, time.Hour); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("checkTimeout(%v, 1h) = %v, want ErrInvalidArgument", to, err)
		}
	}
	if err := checkTimeout(time.Hour, time.Hour); err != nil {
		t.Errorf("checkTimeout(1h, 1h) = %v", err)
	}
}
