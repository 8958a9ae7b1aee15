package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/metrics"
)

// BenchmarkAuditFlood measures what one sandbox refused request after
// refused request (as over one HTTP/2 connection, 60 kB paths) gets stored
// in the audit trail, through the gateway recorder the daemon uses, for 2
// seconds with fsync on. Run: go test -run '^$' -bench AuditFlood ./internal/daemon
func BenchmarkAuditFlood(b *testing.B) {
	for _, size := range []int{60000, 20} {
		b.Run(fmt.Sprintf("path=%d", size), func(b *testing.B) { auditFlood(b, size) })
	}
}

func auditFlood(b *testing.B, size int) {
	for range b.N {
		dir := b.TempDir()
		l, err := audit.Open(audit.Options{Dir: dir})
		if err != nil {
			b.Fatal(err)
		}
		rec := newGatewayRecorder(newFlowRecorder(slog.New(slog.DiscardHandler), metrics.New(), nil), slog.New(slog.DiscardHandler), metrics.New(), nil)
		rec.audit = l
		path := "/" + strings.Repeat("a", size-1)
		ctx := context.Background()
		var sent atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 { // streams of the flooder's connection
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					rec.Request(ctx, gateway.Event{SandboxID: "flooder", Host: "x.test", Method: "GET", Path: path, Reason: "host not allowed"})
					sent.Add(1)
				}
			})
		}
		const dur = 2 * time.Second
		time.Sleep(dur)
		close(stop)
		wg.Wait()
		rec.close()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		stored, bytes := 0, int64(0)
		err = audit.Export(context.Background(), dir, audit.Filter{Sandbox: "flooder"}, func(r *audit.Record, line []byte) error {
			stored++
			bytes += int64(len(line))
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		var disk int64
		filepath.WalkDir(filepath.Join(dir, audit.LogDir), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if st, err := d.Info(); err == nil {
					disk += st.Size()
				}
			}
			return nil
		})
		b.ReportMetric(float64(sent.Load())/dur.Seconds(), "refused/s")
		b.ReportMetric(float64(stored)/dur.Seconds(), "stored/s")
		b.ReportMetric(float64(disk)/dur.Seconds()/1e6, "diskMB/s")
		b.ReportMetric(float64(l.Dropped()), "dropped")
		fmt.Fprintf(os.Stderr, "flood: sent %d, stored %d records of the flooder (%d bytes), %d bytes on disk, dropped %d\n",
			sent.Load(), stored, bytes, disk, l.Dropped())
	}
}

// TestGatewayFloodAudit floods the audit trail through the gateway
// recorder, as a sandbox refused request after refused request would:
// the flooder's records stop at its allowance, what is left out is
// counted per host in an audit.suppressed record, its paths are capped,
// and its own secret use after the flood, another sandbox's refused flow
// and a command the API started are all in the log.
func TestGatewayFloodAudit(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	l, err := audit.Open(audit.Options{Dir: dir, NoSync: true, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	flows := newFlowRecorder(slog.New(slog.DiscardHandler), metrics.New(), l)
	rec := newGatewayRecorder(flows, slog.New(slog.DiscardHandler), metrics.New(), nil)
	defer rec.close()
	rec.audit = l
	ctx := context.Background()
	path := "/" + strings.Repeat("a", 60000)
	const sent = 5000
	for range sent {
		rec.Request(ctx, gateway.Event{SandboxID: "flooder", Host: "x.test", Method: "GET", Path: path, Reason: "host not allowed"})
	}
	// The flooder's own allowed request with a secret, after its flood.
	rec.Request(ctx, gateway.Event{SandboxID: "flooder", Host: "api.test", Method: "POST", Path: "/v1", Allowed: true, Secrets: []string{"TOKEN"}, Status: 200})
	flows.Record(ctx, egress.FlowEvent{SandboxID: "quiet", Proto: "tcp", Name: "y.test", Reason: "no-rule"})
	l.Append(ctx, audit.Event{Type: audit.TypeProcStart, SandboxID: "flooder", Actor: "key:ab", Data: map[string]any{"argv": []string{"id"}}})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	var suppressed int64
	var summary string
	err = audit.Export(ctx, dir, audit.Filter{}, func(r *audit.Record, line []byte) error {
		count[r.Sandbox+" "+r.Type]++
		if r.Type == audit.TypeGateway && len(line) > 2<<10 {
			t.Errorf("a gateway record of %d bytes", len(line))
		}
		if r.Type == audit.TypeSuppressed && r.Sandbox == "flooder" {
			var d struct {
				Total   int64
				Summary string
			}
			json.Unmarshal(r.Data, &d)
			suppressed, summary = d.Total, d.Summary
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	stored := count["flooder "+audit.TypeGateway] - 1 // its allowed request
	if count["flooder "+audit.TypeSecretUse] != 1 {
		t.Errorf("the flooder's secret use was kept out by its refusals: %v", count)
	}
	if stored == 0 || stored > 1000 || int64(stored)+suppressed != sent {
		t.Errorf("stored %d and suppressed %d of %d refused requests", stored, suppressed, sent)
	}
	if want := fmt.Sprintf("%s refused requests to x.test in 1 s", group(suppressed)); summary != want {
		t.Errorf("summary %q, want %q", summary, want)
	}
	if count["quiet "+audit.TypeFlow] != 1 || count["flooder "+audit.TypeProcStart] != 1 {
		t.Errorf("records of others, or the flooder's command, missing: %v", count)
	}
	t.Logf("%v; %s", count, summary)
}

// group writes n with thousands separators.
func group(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
