package audit

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// TypeSuppressed summarises the records of one sandbox that its allowance
// kept out of the log over a window: data {since, until, seconds, total,
// counts: [{type, host, decision, secret, count}], other: {type: count},
// summary}. Nothing a sandbox drives is lost without being counted here.
const TypeSuppressed = "audit.suppressed"

// SandboxDriven reports whether records of type typ are driven by what a
// sandbox does (its network flows, gateway requests, secret uses and
// downloads), so that a sandbox can make as many as it likes: those go
// under the sandbox's allowance. Control-plane actions, lifecycle and
// commands (process.start, process.end, file.write) come from API callers
// and the daemon and never do.
func SandboxDriven(typ string) bool {
	switch typ {
	case TypeFlow, TypeGateway, TypeDownload, TypeSecretUse:
		return true
	}
	return false
}

// Field caps: strings in an event's data are cut to these many bytes (a
// note of their full size goes in the record's "truncated" field).
const (
	capMethod = 32
	capName   = 256  // hosts, names, secrets, rules, reasons
	capPath   = 1024 // paths and URLs of sandbox-driven records
	capPathCP = 4096 // and of the others (PATH_MAX)
	capOther  = 1024 // any other string of a sandbox-driven record
	// maxSuppressedKeys bounds the distinct (type, host, decision, secret)
	// a window of one sandbox counts apart; the rest are counted per type.
	maxSuppressedKeys = 64
	// maxAllowances bounds the sandboxes whose allowance is remembered;
	// past it the full, quiet ones are forgotten (a fresh one is the same).
	maxAllowances = 8192
)

// fieldCap is the cap of a data field, 0 for none.
func fieldCap(key string, driven bool) int {
	switch key {
	case "method":
		return capMethod
	case "host", "name", "observed", "secret", "rule", "reason", "sni", "ecosystem", "version":
		return capName
	case "path", "url":
		if driven {
			return capPath
		}
		return capPathCP
	}
	if driven {
		return capOther
	}
	return 0
}

// cut returns s cut to at most n bytes at a rune boundary, and whether it
// was cut.
func cut(s string, n int) (string, bool) {
	if n <= 0 || len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// capFields returns d with its strings (and the strings of its string
// lists) cut to their caps, and a "truncated" field naming the full size
// of each one cut. d itself is never modified.
func capFields(d map[string]any, driven bool) map[string]any {
	var out map[string]any
	var sizes map[string]int
	for k, v := range d {
		c := fieldCap(k, driven)
		if c == 0 {
			continue
		}
		switch x := v.(type) {
		case string:
			s, ok := cut(x, c)
			if !ok {
				continue
			}
			if out == nil {
				out, sizes = cloneMap(d), map[string]int{}
			}
			out[k], sizes[k] = s, len(x)
		case []string:
			var ys []string
			total := 0
			for i, e := range x {
				s, ok := cut(e, c)
				if ok && ys == nil {
					ys = append([]string(nil), x...)
				}
				if ys != nil {
					ys[i] = s
				}
				total += len(e)
			}
			if ys == nil {
				continue
			}
			if out == nil {
				out, sizes = cloneMap(d), map[string]int{}
			}
			out[k], sizes[k] = ys, total
		}
	}
	if out == nil {
		return d
	}
	out["truncated"] = sizes
	return out
}

func cloneMap(d map[string]any) map[string]any {
	m := make(map[string]any, len(d)+1)
	for k, v := range d {
		m[k] = v
	}
	return m
}

// suppressKey is what a suppressed record is counted under.
type suppressKey struct {
	typ, host, decision, secret string
}

func keyOf(ev *Event) suppressKey {
	str := func(k string) string {
		s, _ := ev.Data[k].(string)
		s, _ = cut(s, capName)
		return s
	}
	k := suppressKey{typ: ev.Type, host: str("host"), decision: str("decision"), secret: str("secret")}
	if k.host == "" {
		k.host = str("name")
	}
	if k.host == "" {
		k.host = str("dst")
	}
	if k.host == "" {
		k.host = str("ecosystem")
	}
	return k
}

// allowances hold each sandbox's allowance of sandbox-driven records: two
// token buckets (rate per second, burst) on the log's clock, one for
// refusals and one for the rest, so that a flood of refused requests
// cannot keep the sandbox's secret uses, downloads and allowed flows out
// of the log; and the counts of what was suppressed since the window
// began.
type allowances struct {
	rate   float64
	burst  float64
	window time.Duration

	mu sync.Mutex
	// +checklocks:mu
	m map[string]*allowance
}

type allowance struct {
	tokens [2]float64 // bucket 0: refusals, 1: the rest
	last   [2]time.Time
	// The open window of suppressed records; total 0 when none.
	since  time.Time
	until  time.Time
	total  int64
	counts map[suppressKey]int64
	other  map[string]int64
}

// bucket is the bucket of an event: refusals apart.
func bucket(ev *Event) int {
	if d, _ := ev.Data["decision"].(string); d == "deny" {
		return 0
	}
	return 1
}

// take spends one of sandbox id's tokens of bucket b, if it has one.
func (a *allowances) take(id string, b int, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.m[id]
	if s == nil {
		if len(a.m) >= maxAllowances {
			a.sweepLocked(now, true)
		}
		s = newAllowance(a.burst, now)
		a.m[id] = s
	}
	if dt := now.Sub(s.last[b]).Seconds(); dt > 0 {
		s.tokens[b] = min(a.burst, s.tokens[b]+dt*a.rate)
		s.last[b] = now
	}
	if s.tokens[b] < 1 {
		return false
	}
	s.tokens[b]--
	return true
}

func newAllowance(burst float64, now time.Time) *allowance {
	return &allowance{tokens: [2]float64{burst, burst}, last: [2]time.Time{now, now}}
}

// suppress counts ev as kept out of the log.
func (a *allowances) suppress(ev *Event, now time.Time) {
	k := keyOf(ev)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.m[ev.SandboxID]
	if s == nil {
		s = &allowance{last: [2]time.Time{now, now}}
		a.m[ev.SandboxID] = s
	}
	if s.total == 0 {
		s.since = now
		s.counts = map[suppressKey]int64{}
	}
	s.total++
	s.until = now
	if _, ok := s.counts[k]; ok || len(s.counts) < maxSuppressedKeys {
		s.counts[k]++
		return
	}
	if s.other == nil {
		s.other = map[string]int64{}
	}
	s.other[k.typ]++
}

// due returns the summary records of the windows open for at least the
// window (all of them when all is set), and closes those windows.
func (a *allowances) due(now time.Time, all bool) []pending {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []pending
	ids := make([]string, 0, len(a.m))
	for id, s := range a.m {
		if s.total > 0 && (all || now.Sub(s.since) >= a.window) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		s := a.m[id]
		out = append(out, pending{time: now, typ: TypeSuppressed, sandbox: id, actor: "daemon", data: mustJSON(s.summary())})
		s.total, s.counts, s.other = 0, nil, nil
	}
	if len(a.m) > maxAllowances/2 {
		a.sweepLocked(now, false)
	}
	return out
}

// sweepLocked forgets the sandboxes whose bucket is full again and which
// have nothing suppressed: a fresh allowance would be the same. With
// force, if that is not enough, it forgets the oldest-idle of the rest
// that have nothing suppressed.
//
// +checklocks:a.mu
func (a *allowances) sweepLocked(now time.Time, force bool) {
	for id, s := range a.m {
		if s.total == 0 && s.full(now, a.rate, a.burst) {
			delete(a.m, id)
		}
	}
	if !force {
		return
	}
	for id, s := range a.m {
		if len(a.m) < maxAllowances/2 {
			break
		}
		if s.total == 0 {
			delete(a.m, id)
		}
	}
}

// full reports whether both buckets are full again.
func (s *allowance) full(now time.Time, rate, burst float64) bool {
	for b := range s.tokens {
		if s.tokens[b]+now.Sub(s.last[b]).Seconds()*rate < burst {
			return false
		}
	}
	return true
}

type suppressedCount struct {
	Type     string `json:"type"`
	Host     string `json:"host,omitempty"`
	Decision string `json:"decision,omitempty"`
	Secret   string `json:"secret,omitempty"`
	Count    int64  `json:"count"`
}

func (s *allowance) summary() map[string]any {
	cs := make([]suppressedCount, 0, len(s.counts))
	for k, n := range s.counts {
		cs = append(cs, suppressedCount{Type: k.typ, Host: k.host, Decision: k.decision, Secret: k.secret, Count: n})
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].Count != cs[j].Count {
			return cs[i].Count > cs[j].Count
		}
		a, b := cs[i], cs[j]
		return a.Type+"\x00"+a.Host+"\x00"+a.Decision+"\x00"+a.Secret < b.Type+"\x00"+b.Host+"\x00"+b.Decision+"\x00"+b.Secret
	})
	secs := max(1, int64(s.until.Sub(s.since).Round(time.Second)/time.Second))
	d := map[string]any{"since": s.since.UTC().Format(time.RFC3339Nano), "until": s.until.UTC().Format(time.RFC3339Nano),
		"seconds": secs, "total": s.total, "counts": cs}
	if len(s.other) > 0 {
		d["other"] = s.other
	}
	var parts []string
	for i, c := range cs {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("%s more", group(s.total-shown(cs[:3]))))
			break
		}
		parts = append(parts, c.phrase())
	}
	if len(cs) <= 3 && len(s.other) > 0 {
		var n int64
		for _, v := range s.other {
			n += v
		}
		parts = append(parts, fmt.Sprintf("%s others", group(n)))
	}
	d["summary"] = fmt.Sprintf("%s in %d s", strings.Join(parts, ", "), secs)
	return d
}

func shown(cs []suppressedCount) int64 {
	var n int64
	for _, c := range cs {
		n += c.Count
	}
	return n
}

// phrase is "1,234 refused requests to x.test".
func (c suppressedCount) phrase() string {
	what := map[string]string{TypeGateway: "requests", TypeFlow: "flows", TypeDownload: "downloads", TypeSecretUse: "uses of secret " + c.Secret}[c.Type]
	if what == "" {
		what = c.Type + " records"
	}
	adj := map[string]string{"deny": "refused ", "allow": "allowed "}[c.Decision]
	p := group(c.Count) + " " + adj + what
	if c.Host != "" {
		p += " to " + c.Host
	}
	return p
}

// group writes n with thousands separators.
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}
