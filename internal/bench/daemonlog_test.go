package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFailureCarriesTheDaemonsReason: a measure whose request the daemon
// answers with a server fault (its body a generic "internal error")
// reports the daemon's logged reason and where its whole log is, for the
// round trips and for the density run. The daemon here is an HTTP server
// logging its faults as fence's does (slog's text form, one error line
// among routine ones).
func TestFailureCarriesTheDaemonsReason(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "bench-daemon.log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	log := slog.New(slog.NewTextHandler(f, nil))
	const reason = "creating sandbox: the reason only the daemon knows"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.Info("routine line")
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", reason)
		log.Info("another routine line")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"code":500,"message":"internal error"}`)
	}))
	defer srv.Close()
	opts := Options{
		Templates: []string{"minimal"}, Iterations: 1,
		Daemon: func(context.Context, int, ...string) (*Daemon, error) {
			return &Daemon{URL: srv.URL, APIKey: "e2b_test", Log: logPath, Stop: func() error { return nil }}, nil
		},
	}
	check := func(what string, err error) {
		t.Helper()
		msg := fmt.Sprint(err)
		for _, want := range []string{"500", "internal error", reason, logPath} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: the failure lacks %q:\n%s", what, want, msg)
			}
		}
		if strings.Contains(msg, "routine line") {
			t.Errorf("%s: the failure quotes routine lines beside the daemon's errors:\n%s", what, msg)
		}
	}
	results, _ := apiRoundTrips(t.Context(), opts, io.Discard)
	failed := 0
	for _, r := range results {
		if r.Err != nil {
			failed++
			check(r.Name, r.Err)
		}
	}
	if failed == 0 {
		t.Fatalf("no round trip failed against a daemon answering 500: %+v", results)
	}
	opts.Density = 2
	err = runDensity(t.Context(), opts, io.Discard)
	t.Logf("density: failed: %v", err)
	check("density", err)
}

// TestDaemonLogReasonFallsBackToTheLastLines: a log without errors or
// warnings gives its last lines.
func TestDaemonLogReasonFallsBackToTheLastLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 30 {
		fmt.Fprintf(&b, "level=INFO msg=line%d\n", i)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	lines, bad, err := daemonLogReason(path, 3)
	if err != nil || bad {
		t.Fatalf("daemonLogReason = %v, %v, want the last lines, no error or warning", bad, err)
	}
	if got := strings.Join(lines, ","); got != "level=INFO msg=line27,level=INFO msg=line28,level=INFO msg=line29" {
		t.Errorf("last lines = %q", got)
	}
}
