package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/metrics"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRecorderPerSandbox floods refused-flow events from one sandbox and
// checks that another sandbox's refusal is still logged, and that the
// flooder's dropped lines are counted on its next line.
func TestRecorderPerSandbox(t *testing.T) {
	var out lockedBuffer
	r := newFlowRecorder(slog.New(slog.NewTextHandler(&out, nil)), metrics.New(), nil)
	ctx := context.Background()
	for range 1000 {
		r.Record(ctx, egress.FlowEvent{SandboxID: "flooder", Proto: "tcp", Reason: "no-rule"})
	}
	r.Record(ctx, egress.FlowEvent{SandboxID: "quiet", Proto: "tcp", Reason: "no-rule"})
	logs := out.String()
	if n := strings.Count(logs, "sandbox_id=flooder"); n > sandboxLogBurst+10 {
		t.Errorf("%d lines of the flooder, want about its burst of %d", n, sandboxLogBurst)
	}
	if !strings.Contains(logs, "sandbox_id=quiet") {
		t.Errorf("the quiet sandbox's refusal was not logged during another's flood:\n%s", logs)
	}
	// The flooder's next allowed line reports what it dropped.
	r.mu.Lock()
	r.sandboxes["flooder"].limit.SetBurst(sandboxLogBurst + 1)
	r.sandboxes["flooder"].limit.SetLimit(1e9)
	r.mu.Unlock()
	r.Record(ctx, egress.FlowEvent{SandboxID: "flooder", Proto: "tcp", Reason: "no-rule"})
	if !strings.Contains(out.String(), "suppressed_before=") {
		t.Errorf("no suppressed_before count on the flooder's next line:\n%s", out.String())
	}
}
