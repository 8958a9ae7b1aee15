package bench

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/fencesandbox/fence/internal/insandbox/nsinit"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// createTracer is a backend that can time the steps of its creates (the
// native backend).
type createTracer interface {
	TraceCreates(on bool)
	CreateTraces() []native.CreateTrace
}

// createStep is one step of a traced create: the time from the mark
// before it (from) to its own (to), each a mark of the daemon's or the
// init's.
type createStep struct {
	name     string
	from, to func(t native.CreateTrace) int64
}

func daemonMark(i int) func(native.CreateTrace) int64 {
	return func(t native.CreateTrace) int64 { return t.Daemon[i] }
}

func initMark(i int) func(native.CreateTrace) int64 {
	return func(t native.CreateTrace) int64 { return t.Init[i] }
}

// createSteps are a native create's steps in the order they end, each
// from the end of the one before; together they make the whole create.
var createSteps = []createStep{
	{"daemon: room waited for, ready init taken", func(t native.CreateTrace) int64 { return t.Start }, daemonMark(native.MarkTook)},
	{"daemon: cgroups and network begun (beside)", daemonMark(native.MarkTook), daemonMark(native.MarkCgroup)},
	{"daemon: state dir, writable layer, /etc files", daemonMark(native.MarkCgroup), daemonMark(native.MarkDirs)},
	{"daemon: agent's listener", daemonMark(native.MarkDirs), daemonMark(native.MarkListener)},
	{"daemon: idmapped template, layer clone, Config sent", daemonMark(native.MarkListener), daemonMark(native.MarkSent)},
	{"init: Config received", daemonMark(native.MarkSent), initMark(nsinit.MarkConfig)},
	{"init: template and layers attached", initMark(nsinit.MarkConfig), initMark(nsinit.MarkAttached)},
	{"init: overlay, /proc /sys /dev, binds, /tmp", initMark(nsinit.MarkAttached), initMark(nsinit.MarkMounted)},
	{"init: hostname, loopback, pivot_root, rlimits", initMark(nsinit.MarkMounted), initMark(nsinit.MarkEntered)},
	{"init: setup's descriptors closed", initMark(nsinit.MarkEntered), initMark(nsinit.MarkClosed)},
	{"init: wait for the go-ahead (cgroups, network)", initMark(nsinit.MarkClosed), initMark(nsinit.MarkGoAhead)},
	{"init: cgroup namespace", initMark(nsinit.MarkGoAhead), initMark(nsinit.MarkCgroupNS)},
	{"init: capabilities, no_new_privs, seccomp", initMark(nsinit.MarkCgroupNS), initMark(nsinit.MarkPrivs)},
	{"agent: serves", initMark(nsinit.MarkPrivs), initMark(nsinit.MarkServing)},
	{"daemon: the answer read", initMark(nsinit.MarkServing), daemonMark(native.MarkStarted)},
	{"daemon: Create returns", daemonMark(native.MarkStarted), daemonMark(native.MarkReturned)},
}

// createAside are spans that run beside the steps, not in their sequence.
var createAside = []createStep{
	{"beside, from their start: cgroups made, init in them", daemonMark(native.MarkCgroup), daemonMark(native.MarkJoined)},
	{"beside, from their start: network attached", daemonMark(native.MarkCgroup), daemonMark(native.MarkNetwork)},
	{"beside: cgroups and network both done, after the Config sent", daemonMark(native.MarkSent), daemonMark(native.MarkAttached)},
}

// writeCreateSteps writes the median of each step of the traced creates
// (the first, a warm-up's, left out).
func writeCreateSteps(out io.Writer, traces []native.CreateTrace) {
	var ts []native.CreateTrace
	for _, t := range traces {
		if len(t.Init) == nsinit.NumMarks {
			ts = append(ts, t)
		}
	}
	if len(ts) > 1 {
		ts = ts[1:]
	}
	if len(ts) == 0 {
		return
	}
	fmt.Fprintf(out, "a cold create, step by step (%d creates; the daemon's and the init's CLOCK_MONOTONIC marks; the means add up, the medians need not):\n", len(ts))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  step\tmedian\tmean\t\n")
	var sum, sumMean time.Duration
	row := func(s createStep, add bool) {
		d, m := stepStats(ts, s)
		if add {
			sum += d
			sumMean += m
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t\n", s.name, ms(d), ms(m))
	}
	for _, s := range createSteps {
		row(s, true)
	}
	fmt.Fprintf(tw, "  sum\t%s\t%s\t\n", ms(sum), ms(sumMean))
	whole := createStep{"the create, from its call to its return", func(t native.CreateTrace) int64 { return t.Start }, daemonMark(native.MarkReturned)}
	row(whole, false)
	for _, s := range createAside {
		row(s, false)
	}
	tw.Flush()
}

// stepStats is the median and the mean of step s over ts (negative spans
// count as 0: a span beside the steps may end before it starts).
func stepStats(ts []native.CreateTrace, s createStep) (median, mean time.Duration) {
	d := make([]time.Duration, len(ts))
	var sum time.Duration
	for i, t := range ts {
		d[i] = time.Duration(max(0, s.to(t)-s.from(t)))
		sum += d[i]
	}
	slices.Sort(d)
	return d[len(d)/2], sum / time.Duration(len(d))
}
