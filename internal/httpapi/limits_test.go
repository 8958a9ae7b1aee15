package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// newQuotaEnv is a test server whose teams' limits live in its store.
func newQuotaEnv(t *testing.T, defaults tenancy.Limits) (*testEnv, *tenancy.Quotas) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	q, err := tenancy.NewQuotas(st, defaults)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	host := fake.NewHost()
	nets := fences.New(fences.Options{Logger: log})
	m, err := sandbox.New(sandbox.Options{Network: nets, Backend: fake.New(fake.Options{Host: host}), Store: st,
		Templates: templates{"base": "/rootfs/base"}, Logger: log, Quota: q})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	clock := time.Unix(1_000_000, 0) // fixed: buckets refill never
	srv := httptest.NewServer(New(Options{Manager: m, Network: nets, APIKey: testKey, Logger: log, Quotas: q,
		Now: func() time.Time { return clock }}))
	t.Cleanup(func() {
		srv.Close()
		m.Shutdown(context.Background())
		host.Close()
		st.Close()
	})
	return &testEnv{srv: srv, m: m, net: nets, host: host, st: st}, q
}

func wantE2BError(t *testing.T, resp *http.Response, b []byte, status int, msg string) {
	t.Helper()
	var e api.Error
	if resp.StatusCode != status || json.Unmarshal(b, &e) != nil || e.Code != status || !strings.Contains(e.Message, msg) {
		t.Fatalf("got %d %s; want %d with %q", resp.StatusCode, b, status, msg)
	}
}

func TestTeamLimitsRoutes(t *testing.T) {
	e, q := newQuotaEnv(t, tenancy.Limits{ConcurrentSandboxes: 5})
	path := "/teams/" + tenancy.DefaultTeamID + "/limits"
	resp, b := e.api(t, "GET", path, "")
	var got tenancy.Limits
	if resp.StatusCode != 200 || json.Unmarshal(b, &got) != nil || got != (tenancy.Limits{ConcurrentSandboxes: 5}) {
		t.Fatalf("GET %s = %d %s", path, resp.StatusCode, b)
	}
	// Bad input changes nothing.
	for _, body := range []string{`{"concurrentSandboxes":-1}`, `{"vcpus":-0.5}`, `{"concurrentSandbox":1}`, `nope`, ``} {
		resp, b := e.api(t, "PUT", path, body)
		wantE2BError(t, resp, b, http.StatusBadRequest, "")
	}
	resp, b = e.api(t, "PUT", "/teams/00000000-0000-4000-8000-0000000000ff/limits", `{"concurrentSandboxes":1}`)
	wantE2BError(t, resp, b, http.StatusNotFound, "Team not found")
	if rows, err := e.st.TeamLimits(t.Context()); err != nil || len(rows) != 0 {
		t.Fatalf("refused PUTs stored %v, %v", rows, err)
	}
	if l := q.Limits(tenancy.DefaultTeamID); l != (tenancy.Limits{ConcurrentSandboxes: 5}) {
		t.Fatalf("refused PUTs changed the limits: %+v", l)
	}

	// A limit set is enforced with E2B's status and message.
	resp, b = e.api(t, "PUT", path, `{"concurrentSandboxes":2}`)
	if resp.StatusCode != 200 || json.Unmarshal(b, &got) != nil || got != (tenancy.Limits{ConcurrentSandboxes: 2}) {
		t.Fatalf("PUT = %d %s", resp.StatusCode, b)
	}
	e.create(t, `{"templateID":"base"}`)
	e.create(t, `{"templateID":"base"}`)
	resp, b = e.api(t, "POST", "/v2/sandboxes", `{"templateID":"base"}`)
	wantE2BError(t, resp, b, http.StatusTooManyRequests, "you have reached the maximum number of concurrent E2B sandboxes (2)")
	if rows, _ := e.st.TeamLimits(t.Context()); rows[tenancy.DefaultTeamID].ConcurrentSandboxes != 2 {
		t.Fatalf("stored %v", rows)
	}
	// GET's body is what PUT takes.
	_, b = e.api(t, "GET", path, "")
	if r2, b2 := e.api(t, "PUT", path, string(b)); r2.StatusCode != 200 || string(b2) != string(b) {
		t.Fatalf("PUT of GET's body = %d %s; want 200 %s", r2.StatusCode, b2, b)
	}
	var u tenancy.Usage
	resp, b = e.api(t, "GET", path+"/usage", "")
	if json.Unmarshal(b, &u) != nil || u.Running != 2 {
		t.Fatalf("GET after creates = %d %s", resp.StatusCode, b)
	}
}

func TestRequestRateLimit(t *testing.T) {
	e, _ := newQuotaEnv(t, tenancy.Limits{RequestsPerSecond: 0.5, Burst: 3})
	for i := range 3 {
		resp, b := e.api(t, "GET", "/v2/sandboxes", "")
		if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Limit") != "3" || resp.Header.Get("RateLimit-Remaining") != fmt.Sprint(2-i) {
			t.Fatalf("request %d = %d %s, headers %v", i, resp.StatusCode, b, resp.Header)
		}
	}
	resp, b := e.api(t, "GET", "/v2/sandboxes", "")
	wantE2BError(t, resp, b, http.StatusTooManyRequests, "Rate limit exceeded")
	if ra := resp.Header.Get("Retry-After"); ra != "2" {
		t.Fatalf("Retry-After = %q, want 2", ra)
	}
	// Unauthenticated requests are refused before they count.
	resp, _ = e.do(t, "GET", "/v2/sandboxes", "")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unauthenticated = %d", resp.StatusCode)
	}
}
