package tbuild

import "testing"

// TestChanged: the channel of Changed closes at the next log line of a
// build, and a new one is given after.
func TestChanged(t *testing.T) {
	s := newTestService(t)
	reg, err := s.Register(t.Context(), "app", nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ch := s.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before any log line")
	default:
	}
	s.logf(reg.BuildID, "info", "base", "step %d", 1)
	select {
	case <-ch:
	default:
		t.Fatal("Changed did not close at a log line")
	}
	info, err := s.Status(reg.TemplateID, reg.BuildID, 0, 100, "")
	if err != nil || len(info.LogEntries) == 0 || info.LogEntries[len(info.LogEntries)-1].Message != "step 1" {
		t.Fatalf("Status after the line = %+v, %v", info, err)
	}
	if next := s.Changed(); next == ch {
		t.Error("Changed gave the closed channel again")
	}
}
