package bench

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// procTimes is the CPU time (user and system, every thread's) of each
// process on the host, by PID, with its command name and start time.
type procTimes map[int]procTime

type procTime struct {
	comm  string
	start int64 // clock ticks after boot: tells a reused PID apart
	cpu   time.Duration
}

// sampleProcs reads /proc/PID/stat of every process on the host; nil if
// /proc cannot be listed.
func sampleProcs() procTimes {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	s := make(procTimes, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		if t, ok := parseProcStat(string(raw)); ok {
			s[pid] = t
		}
	}
	return s
}

// parseProcStat reads the command name, the start time and the user and
// system time of a process from its /proc/PID/stat line. The name is in
// parentheses and may hold spaces and parentheses itself: the fields
// resume after the last ')'.
func parseProcStat(line string) (procTime, bool) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procTime{}, false
	}
	f := strings.Fields(line[end+1:])
	if len(f) < 20 {
		return procTime{}, false
	}
	// f[0] is the state (field 3); utime and stime are fields 14 and 15,
	// starttime field 22.
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	start, err3 := strconv.ParseInt(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procTime{}, false
	}
	return procTime{comm: line[open+1 : end], start: start, cpu: clockTicks(utime + stime)}, true
}

// commandCPU is the CPU time the processes of one command name took
// between two samples.
type commandCPU struct {
	name  string
	procs int
	cpu   time.Duration
}

// byCommand sums, by command name, the CPU time each process present in
// both samples took between a and b, leaving out the process skip (the
// daemon, reported on its own), busiest first. A process is the same in
// both if its PID and start time are; its name is the one in b (a
// kernel worker's changes with its work). Names are cut at their first
// '/' ("kworker/u8:3-loop12" is a kworker) and at "fence-sandbox" (the
// in-sandbox binary's file name carries its hash), so that the
// instances of one program add up; what is not printable becomes '?'.
func byCommand(a, b procTimes, skip int) []commandCPU {
	sums := map[string]*commandCPU{}
	for pid, t1 := range b {
		t0, ok := a[pid]
		if !ok || pid == skip || t0.start != t1.start {
			continue
		}
		name, _, _ := strings.Cut(t1.comm, "/")
		if strings.HasPrefix(name, "fence-sandbox") {
			name = "fence-sandbox"
		}
		// Any process names itself (prctl): a sandbox's, printed as it
		// is, could put control characters on the operator's terminal.
		name = strings.Map(func(r rune) rune {
			if unicode.IsPrint(r) {
				return r
			}
			return '?'
		}, name)
		c := sums[name]
		if c == nil {
			c = &commandCPU{name: name}
			sums[name] = c
		}
		c.procs++
		c.cpu += t1.cpu - t0.cpu
	}
	out := make([]commandCPU, 0, len(sums))
	for _, c := range sums {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(x, y commandCPU) int {
		return cmp.Or(cmp.Compare(y.cpu, x.cpu), cmp.Compare(x.name, y.name))
	})
	return out
}

// describeBusiest formats the k busiest commands of cmds as CPU time per
// second over d ("process_api 259.0, kdamond.0 66.5, fence-sandbox 7.0
// (2002 processes)"), "none" if none took any.
func describeBusiest(cmds []commandCPU, k int, d time.Duration) string {
	var parts []string
	for _, c := range cmds[:min(k, len(cmds))] {
		if c.cpu <= 0 {
			break
		}
		s := fmt.Sprintf("%s %.1f", c.name, perSecond(c.cpu, d))
		if c.procs > 1 {
			s += fmt.Sprintf(" (%d processes)", c.procs)
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// perSecond is t in milliseconds per second of d.
func perSecond(t, d time.Duration) float64 {
	return float64(t.Microseconds()) / 1000 / d.Seconds()
}
