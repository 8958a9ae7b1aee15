package usage

import "time"

// Acc accumulates a live sandbox's usage. It is not safe for concurrent
// use: its owner (the core's record of the sandbox) guards it. Its times
// are the daemon clock's own readings, monotonic reading kept (not
// .UTC(), which drops it): durations are measured on the monotonic clock,
// so a step of the wall clock (NTP, a resumed VM) during a sandbox's life
// is not charged to it.
type Acc struct {
	keys       *keyTotals // the Meter's; nil counts for no key
	actor      string
	created    time.Time
	have       bool // a reading was taken
	lastAt     time.Time
	lastCPU    time.Duration
	lastMem    int64
	cpu        time.Duration
	memGiBs    float64
	idle       time.Duration
	stateSince time.Time
	paused     bool
	running    time.Duration
	pausedFor  time.Duration
	out, in    int64
}

// Actor is who created the sandbox.
func (u *Acc) Actor() string { return u.actor }

// Times are the clock readings the sandbox's usage is measured between
// (its creation, its last change between running and paused, and its
// last reading if one was taken).
func (u *Acc) Times() []time.Time {
	t := []time.Time{u.created, u.stateSince}
	if u.have {
		t = append(t, u.lastAt)
	}
	return t
}

// Mark records a change between running and paused at now.
func (u *Acc) Mark(now time.Time, paused bool) {
	u.wall(now)
	u.paused = paused
}

func (u *Acc) wall(now time.Time) {
	if d := now.Sub(u.stateSince); d > 0 {
		if u.paused {
			u.pausedFor += d
		} else {
			u.running += d
		}
		u.stateSince = now
	}
}

// Add takes a reading of the sandbox's CPU counter and memory at at, and
// counts what it adds for the sandbox's key.
func (u *Acc) Add(at time.Time, cpu time.Duration, mem int64) {
	if u.created.IsZero() {
		u.created, u.stateSince = at, at
	}
	prevAt, prevMem := u.lastAt, u.lastMem
	if !u.have {
		// The time before the first reading is charged at that reading.
		prevAt, prevMem = u.created, mem
	}
	dcpu := cpu - u.lastCPU
	if dcpu < 0 {
		dcpu = 0
	}
	dt := at.Sub(prevAt)
	if dt < 0 {
		dt = 0
	}
	dmem := float64(prevMem+mem) / 2 / gib * dt.Seconds()
	if u.have && !u.paused && dt > 0 && dcpu.Seconds() < idleFraction*dt.Seconds() {
		u.idle += dt
	}
	u.cpu += dcpu
	u.memGiBs += dmem
	u.have, u.lastAt, u.lastCPU, u.lastMem = true, at, cpu, mem
	if u.keys != nil {
		u.keys.add(u.actor, dcpu, dmem, 0, 0)
	}
}

// AddEgress adds the bytes of one ended flow (the Meter counts them for
// the key).
func (u *Acc) AddEgress(out, in int64) {
	u.out += out
	u.in += in
}

// Egress returns the bytes of the flows ended so far: sent, received.
func (u *Acc) Egress() (out, in int64) { return u.out, u.in }

// Snapshot returns the usage so far, at now; the caller fills in the
// sandbox's ID, template and state.
func (u *Acc) Snapshot(now time.Time) Usage {
	c := *u
	c.wall(now)
	return Usage{
		Actor: c.actor, CreatedAt: c.created.UTC(), CPUSeconds: c.cpu.Seconds(), MemoryGiBSeconds: c.memGiBs,
		IdleSeconds: c.idle.Seconds(), RunningSeconds: c.running.Seconds(), PausedSeconds: c.pausedFor.Seconds(),
		EgressBytesOut: c.out, EgressBytesIn: c.in,
	}
}
