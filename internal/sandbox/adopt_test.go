package sandbox

import (
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
	"github.com/fencesandbox/fence/internal/store"
)

// TestPausedEntry: a paused sandbox taken over after a restart keeps its
// record's fields; without resume data its lifecycle is the defaults';
// with it, the pause's configuration, and its layers as the kind of pause
// left them: parked on the pause's layer without memory, booted on the
// boot layer with memory.
func TestPausedEntry(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := &adopter{meter: usage.NewMeter(nil, nil, nil), timeout: 5 * time.Minute, now: func() time.Time { return t0 }}
	rec := &store.Sandbox{ID: "sb1", Template: "tid", Alias: "base", State: store.StatePaused,
		CreatedAt: t0.Add(-time.Hour), EndAt: t0, CPUs: 2, MemoryMB: 512, DiskMB: 1024, EnvdAccessToken: "tok"}
	nc := &netconf.Config{}
	cr := coldRecord{BootLayer: "boot", CreatedLayer: "created", BaseTemplate: "base", Timeout: time.Hour,
		Spec: isolation.Spec{RootFS: "/t/base"}, TrafficAccessToken: "traffic", AutoPause: true, AutoResume: true}
	check := func(what string, e *entry, layer, cold string, timeout time.Duration, autoPause bool) {
		t.Helper()
		e.mu.Lock()
		defer e.mu.Unlock()
		i := e.info
		if i.ID != rec.ID || i.TemplateID != rec.Template || i.Alias != rec.Alias || i.State != StatePaused ||
			!i.StartedAt.Equal(rec.CreatedAt) || !i.EndAt.Equal(rec.EndAt) || i.CPUs != 2 || i.MemoryMB != 512 ||
			i.DiskMB != 1024 || i.EnvdAccessToken != "tok" || i.Metadata == nil {
			t.Errorf("%s: info %+v does not hold the record's fields", what, i)
		}
		if e.layer != layer || e.cold != cold || e.coldKept != (cold != "") || e.timeout != timeout || i.AutoPause != autoPause {
			t.Errorf("%s: layer %q cold %q kept %v timeout %v autoPause %v; want %q %q %v %v %v",
				what, e.layer, e.cold, e.coldKept, e.timeout, i.AutoPause, layer, cold, cold != "", timeout, autoPause)
		}
		select {
		case <-e.runDone:
		default:
			t.Errorf("%s: its run is not over", what)
		}
	}
	check("no resume data", a.pausedEntry(t.Context(), rec, nc, coldRecord{}, false), "", "", 5*time.Minute, false)
	e := a.pausedEntry(t.Context(), rec, nc, cr, true)
	check("a pause with memory", e, "boot", "", time.Hour, true)
	if e.spec.RootFS != "/t/base" || e.createdLayer != "created" || !e.checkpointed.Load() || e.info.TrafficAccessToken != "traffic" { // +checklocksignore: e is not shared
		t.Errorf("a pause with memory: the resume data's configuration is not kept: %+v", e)
	}
	cr.Layer = "paused"
	check("a pause without memory", a.pausedEntry(t.Context(), rec, nc, cr, true), "", "paused", time.Hour, true)
}
