package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func (d *daemon) teamLimits(t *testing.T) tenancy.Limits {
	t.Helper()
	r := d.do(t, "GET", "/teams/"+tenancy.DefaultTeamID+"/limits", d.Key, nil, nil)
	var l tenancy.Limits
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &l) != nil {
		t.Fatalf("GET limits = %d %s", r.Status, r.Body)
	}
	return l
}

func (d *daemon) teamUsage(t *testing.T) tenancy.Usage {
	t.Helper()
	r := d.do(t, "GET", "/teams/"+tenancy.DefaultTeamID+"/limits/usage", d.Key, nil, nil)
	var u tenancy.Usage
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &u) != nil {
		t.Fatalf("GET limits/usage = %d %s", r.Status, r.Body)
	}
	return u
}

func (d *daemon) putTeamLimits(t *testing.T, team, body string) rawResponse {
	t.Helper()
	return d.do(t, "PUT", "/teams/"+team+"/limits", d.Key, strings.NewReader(body), nil)
}

func wantE2BError(t *testing.T, r rawResponse, status int, msg string) {
	t.Helper()
	var e api.Error
	if r.Status != status || json.Unmarshal(r.Body, &e) != nil || e.Code != status || !strings.Contains(e.Message, msg) {
		t.Fatalf("got %d %s; want %d {code, message ~ %q}", r.Status, r.Body, status, msg)
	}
}

// TestTeamQuotas: a team's limits are set through the API (bad input
// changes nothing), 50 concurrent creates against a limit of 10 leave
// exactly 10 sandboxes and answer the others E2B's 429, paused sandboxes
// are counted apart, and the counts and limits hold over a restart.
// Root: namespaces, cgroups.
func TestTeamQuotas(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	ctx := ctxT(t)

	before := d.teamLimits(t)
	for _, body := range []string{`{"concurrentSandboxes":-1}`, `{"pausedSandboxes":-1}`, `{"concurrentSandboxes":"ten"}`, `{"bogus":1}`} {
		wantE2BError(t, d.putTeamLimits(t, tenancy.DefaultTeamID, body), http.StatusBadRequest, "")
	}
	wantE2BError(t, d.putTeamLimits(t, "00000000-0000-4000-8000-00000000beef", `{"concurrentSandboxes":1}`), http.StatusNotFound, "Team not found")
	if after := d.teamLimits(t); after != before {
		t.Fatalf("refused PUTs changed the limits: %+v, was %+v", after, before)
	}
	if r := d.putTeamLimits(t, tenancy.DefaultTeamID, `{"concurrentSandboxes":10,"pausedSandboxes":3}`); r.Status != http.StatusOK {
		t.Fatalf("PUT limits = %d %s", r.Status, r.Body)
	}

	var mu sync.Mutex
	var created []string
	refused := 0
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			r := d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(`{"templateID":"minimal","timeout":600}`), nil)
			mu.Lock()
			defer mu.Unlock()
			switch r.Status {
			case http.StatusCreated:
				var sb api.Sandbox
				if err := json.Unmarshal(r.Body, &sb); err != nil {
					t.Errorf("create: %v", err)
				}
				created = append(created, sb.SandboxID)
			case http.StatusTooManyRequests:
				var e api.Error
				if json.Unmarshal(r.Body, &e) != nil || e.Code != 429 ||
					e.Message != "you have reached the maximum number of concurrent E2B sandboxes (10). If you need more, please visit 'https://e2b.dev/docs/billing'" {
					t.Errorf("refused create: %s", r.Body)
				}
				refused++
			default:
				t.Errorf("create = %d %s", r.Status, r.Body)
			}
		})
	}
	wg.Wait()
	if len(created) != 10 || refused != 40 {
		t.Fatalf("created %d, refused %d; want 10, 40", len(created), refused)
	}
	list, err := d.Client.List(ctx, client.ListOptions{})
	if err != nil || len(list) != 10 {
		t.Fatalf("List = %d sandboxes, %v; want 10", len(list), err)
	}

	// Three paused (without memory: they outlive the daemon), the rest
	// killed; a fourth pause is over the paused limit.
	for _, id := range created[:3] {
		if err := d.Client.PauseWithoutMemory(ctx, id); err != nil {
			t.Fatalf("PauseWithoutMemory(%s): %v", id, err)
		}
	}
	r := d.do(t, "POST", "/sandboxes/"+created[3]+"/pause", d.Key, nil, nil)
	wantE2BError(t, r, http.StatusTooManyRequests, "maximum number of paused sandboxes (3)")
	for _, id := range created[3:] {
		if err := d.Client.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if u := d.teamUsage(t); u.Running != 0 || u.Paused != 3 {
		t.Fatalf("usage before the restart %+v", u)
	}

	d.Stop()
	d.Restart()
	if l, u := d.teamLimits(t), d.teamUsage(t); l != (tenancy.Limits{ConcurrentSandboxes: 10, PausedSandboxes: 3}) || u != (tenancy.Usage{Paused: 3}) {
		t.Fatalf("after the restart: %+v, %+v; want the limits 10/3 and 3 paused", l, u)
	}
	if r := d.putTeamLimits(t, tenancy.DefaultTeamID, `{"concurrentSandboxes":1}`); r.Status != http.StatusOK {
		t.Fatalf("PUT limits = %d %s", r.Status, r.Body)
	}
	r = d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(`{"templateID":"minimal"}`), nil)
	if r.Status != http.StatusCreated {
		t.Fatalf("create beside 3 paused = %d %s", r.Status, r.Body)
	}
	var running api.Sandbox
	json.Unmarshal(r.Body, &running)
	// The paused ones are still counted: none can pause, none resume.
	wantE2BError(t, d.do(t, "POST", "/sandboxes/"+running.SandboxID+"/pause", d.Key, nil, nil),
		http.StatusTooManyRequests, "maximum number of paused sandboxes (3)")
	wantE2BError(t, d.do(t, "POST", "/sandboxes/"+created[0]+"/connect", d.Key, strings.NewReader(`{"timeout":60}`), nil),
		http.StatusTooManyRequests, "maximum number of concurrent E2B sandboxes (1)")
	if err := d.Client.Kill(ctx, running.SandboxID); err != nil {
		t.Fatal(err)
	}
	if r := d.do(t, "POST", "/sandboxes/"+created[0]+"/connect", d.Key, strings.NewReader(`{"timeout":60}`), nil); r.Status/100 != 2 {
		t.Fatalf("connect under the limit = %d %s", r.Status, r.Body)
	}
	for _, id := range created[:3] {
		if err := d.Client.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if u := d.teamUsage(t); u != (tenancy.Usage{}) {
		t.Fatalf("usage after the kills %+v", u)
	}
}

// TestRequestRateLimit: over its rate a key is answered E2B's 429 with
// Retry-After; a daemon-wide default from the flags applies.
func TestRequestRateLimit(t *testing.T) {
	d := startDaemon(t, newDataDir(t), "--team-rate", "0.01", "--team-burst", "3")
	for i := range 3 {
		r := d.do(t, "GET", "/v2/sandboxes", d.Key, nil, nil)
		if r.Status != http.StatusOK || r.Header.Get("RateLimit-Remaining") != fmt.Sprint(2-i) {
			t.Fatalf("request %d = %d %s %v", i, r.Status, r.Body, r.Header)
		}
	}
	r := d.do(t, "GET", "/v2/sandboxes", d.Key, nil, nil)
	wantE2BError(t, r, http.StatusTooManyRequests, "Rate limit exceeded")
	if s, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || s < 1 || s > 100 {
		t.Fatalf("Retry-After = %q", r.Header.Get("Retry-After"))
	}
}
