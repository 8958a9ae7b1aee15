package daemon

import (
	"context"
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
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/metrics"
)

// BenchmarkAuditFlood measures what one sandbox refused request after
// refused request (as over one HTTP/2 connection, 60 kB paths) gets stored
// in the audit trail, through the gateway recorder the daemon uses, for 2
// seconds with fsync on; and how long another sandbox's record waits to be
// queued meanwhile. Run: go test -run '^$' -bench AuditFlood ./internal/daemon
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
		rec := newGatewayRecorder(newFlowRecorder(slog.New(slog.DiscardHandler), metrics.New()), slog.New(slog.DiscardHandler), metrics.New(), nil)
		rec.audit = l
		path := "/" + strings.Repeat("a", size-1)
		ctx := context.Background()
		var sent atomic.Int64
		var quietMax atomic.Int64
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
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				t0 := time.Now()
				l.Append(ctx, audit.Event{Type: audit.TypeProcStart, SandboxID: "quiet", Actor: "key:x", Data: map[string]any{"argv": []string{"true"}}})
				if d := time.Since(t0).Nanoseconds(); d > quietMax.Load() {
					quietMax.Store(d)
				}
			}
		})
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
		b.ReportMetric(float64(quietMax.Load())/1e6, "quiet-max-ms")
		b.ReportMetric(float64(l.Dropped()), "dropped")
		fmt.Fprintf(os.Stderr, "flood: sent %d, stored %d records of the flooder (%d bytes), %d bytes on disk, quiet sandbox's longest Append %v, dropped %d\n",
			sent.Load(), stored, bytes, disk, time.Duration(quietMax.Load()), l.Dropped())
	}
}
