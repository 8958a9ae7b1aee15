package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func TestApprovalRoutes(t *testing.T) {
	e := newTestEnv(t)
	var decided []approvals.Request
	q := approvals.New(approvals.Options{Decided: func(r approvals.Request) { decided = append(decided, r) }})
	al, err := audit.Open(audit.Options{Dir: t.TempDir(), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Manager: e.m, Pauses: e.m.Pauses(), Network: e.net, APIKey: testKey, Approvals: q, Audit: al}))
	t.Cleanup(func() {
		srv.Close()
		al.Close()
	})
	e.srv = srv

	// The stream starts before the request exists.
	sreq, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+"/approvals/stream", nil)
	sreq.Header.Set("X-API-Key", testKey)
	sresp, err := srv.Client().Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	if resp, _ := e.do(t, "GET", "/approvals", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /approvals without a key = %d", resp.StatusCode)
	}

	// A request is of a sandbox of the caller's team.
	sb := e.create(t, `{"templateID":"base"}`).SandboxID
	got := make(chan approvals.Decision, 1)
	go func() {
		d, _ := q.Ask(context.Background(), sb, "", "example.com")
		got <- d
	}()
	var list []approvals.Request
	for len(list) == 0 {
		_, b := e.api(t, "GET", "/approvals", "")
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatalf("GET /approvals: %v %s", err, b)
		}
		time.Sleep(time.Millisecond)
	}
	if list[0].Name != "example.com" || list[0].SandboxID != sb {
		t.Fatalf("list %+v", list)
	}
	buf := make([]byte, 4096)
	n, _ := sresp.Body.Read(buf)
	if s := string(buf[:n]); !strings.Contains(s, "event: pending") || !strings.Contains(s, "example.com") {
		t.Fatalf("stream: %q", s)
	}
	for _, bad := range []string{`{"decision":"maybe"}`, `{}`, `nope`} {
		if resp, b := e.api(t, "POST", "/approvals/"+list[0].ID, bad); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s = %d %s, want 400", bad, resp.StatusCode, b)
		}
	}
	if resp, _ := e.api(t, "POST", "/approvals/apr_missing", `{"decision":"once"}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST of a missing request = %d, want 404", resp.StatusCode)
	}
	if resp, b := e.api(t, "POST", "/approvals/"+list[0].ID, `{"decision":"once"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("POST once = %d %s", resp.StatusCode, b)
	}
	if d := <-got; d != approvals.Once {
		t.Fatalf("held ask got %q", d)
	}
	if len(decided) != 1 || !strings.Contains(decided[0].Actor, "key:"+tenancy.BootstrapKeyID) {
		t.Fatalf("decided %+v", decided)
	}
}

func TestApprovalRoutesOff(t *testing.T) {
	e := newTestEnv(t)
	if resp, _ := e.api(t, "GET", "/approvals", ""); resp.StatusCode != http.StatusNotImplemented {
		t.Fatalf("GET /approvals without a queue = %d, want 501", resp.StatusCode)
	}
}
