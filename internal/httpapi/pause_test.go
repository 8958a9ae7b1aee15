package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/sandbox"
)

func (e *testEnv) info(t *testing.T, id string) api.SandboxDetail {
	t.Helper()
	resp, b := e.api(t, "GET", "/sandboxes/"+id, "")
	if resp.StatusCode != 200 {
		t.Fatalf("GET /sandboxes/%s = %d %s", id, resp.StatusCode, b)
	}
	var d api.SandboxDetail
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func (e *testEnv) listStates(t *testing.T, query string) map[string]string {
	t.Helper()
	resp, b := e.api(t, "GET", "/v2/sandboxes"+query, "")
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v2/sandboxes%s = %d %s", query, resp.StatusCode, b)
	}
	var l []api.ListedSandbox
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range l {
		out[s.SandboxID] = s.State
	}
	return out
}

func TestPauseRoutes(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base","timeout":60}`)
	other := e.create(t, `{"templateID":"base"}`)
	id := s.SandboxID
	before := e.info(t, id)
	if before.State != "running" || before.Lifecycle == nil || before.Lifecycle.OnTimeout != "kill" || before.Lifecycle.AutoResume {
		t.Errorf("GET running = %+v, want running, lifecycle {kill, false}", before)
	}

	// Bad input changes nothing.
	for _, tc := range []struct{ path, body, msg string }{
		{"/sandboxes/" + id + "/pause", `{"memory":`, "malformed"},
	} {
		resp, b := e.api(t, "POST", tc.path, tc.body)
		wantError(t, "POST "+tc.path+" "+tc.body, resp, b, 400, tc.msg)
	}
	// The fake backend keeps no layers: no filesystem-only pause.
	resp, b := e.api(t, "POST", "/sandboxes/"+id+"/pause", `{"memory":false}`)
	wantError(t, "POST pause memory false", resp, b, 501, "filesystem layers")
	if got := e.info(t, id).State; got != "running" {
		t.Fatalf("state after bad requests = %s, want running", got)
	}
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/resume", `{}`)
	wantError(t, "POST resume of a running sandbox", resp, b, 409, "already running")

	// Pause: 204, with the SDK's body (js 2.51 always sends one) or none.
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/pause", `{}`)
	if resp.StatusCode != 204 || len(b) != 0 {
		t.Fatalf("POST pause = %d %s, want 204", resp.StatusCode, b)
	}
	if p, _ := e.fakeSandbox(t, id).Paused(); !p {
		t.Errorf("backend sandbox not paused")
	}
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/pause", "")
	wantError(t, "POST pause of a paused sandbox", resp, b, 409, "'"+id+"' is already paused")
	// A cold boot of a sandbox paused with its memory is refused, never
	// turned into a resume with its memory.
	for _, path := range []string{"/v2/sandboxes/" + id + "/connect", "/sandboxes/" + id + "/connect", "/sandboxes/" + id + "/resume"} {
		resp, b = e.api(t, "POST", path, `{"timeout":60,"memory":false}`)
		wantError(t, "POST "+path+" memory false", resp, b, 400, "sandbox_memory_override_disabled")
	}
	if p, _ := e.fakeSandbox(t, id).Paused(); !p {
		t.Errorf("backend sandbox not paused after refused cold boots")
	}
	for _, path := range []string{"/sandboxes/unknown/pause", "/sandboxes/unknown/resume", "/v2/sandboxes/unknown/connect", "/sandboxes/BAD%2F/pause"} {
		resp, b = e.api(t, "POST", path, `{}`)
		wantError(t, "POST "+path, resp, b, 404, "")
	}
	paused := e.info(t, id)
	if paused.State != "paused" || !paused.StartedAt.Equal(before.StartedAt) || paused.EndAt.After(time.Now()) ||
		paused.EnvdAccessToken != s.EnvdAccessToken {
		t.Errorf("GET paused = %+v; want paused, same start, endAt = the pause time, same token", paused)
	}
	if got := e.listStates(t, "?state=paused"); len(got) != 1 || got[id] != "paused" {
		t.Errorf("list state=paused = %v, want only %s", got, id)
	}
	if got := e.listStates(t, "?state=running"); len(got) != 1 || got[other.SandboxID] != "running" {
		t.Errorf("list state=running = %v, want only %s", got, other.SandboxID)
	}
	if got := e.listStates(t, "?state=running,paused"); len(got) != 2 || got[id] != "paused" {
		t.Errorf("list state=running,paused = %v", got)
	}
	if got := e.listStates(t, ""); len(got) != 2 {
		t.Errorf("list without state = %v, want both", got)
	}
	// v1's list is of running sandboxes.
	resp, b = e.api(t, "GET", "/sandboxes", "")
	if resp.StatusCode != 200 || strings.Contains(string(b), id) {
		t.Errorf("GET /sandboxes = %d %s, want the paused sandbox absent", resp.StatusCode, b)
	}
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/timeout", `{"timeout":30}`)
	wantError(t, "POST timeout of a paused sandbox", resp, b, 404, "paused")

	// Sandbox traffic gets the proxy's 502, on the agent and other ports.
	for _, port := range []string{"49983", "8000"} {
		resp, b = e.do(t, "GET", "/health", "", "E2b-Sandbox-Id: "+id, "E2b-Sandbox-Port: "+port, "X-Access-Token: "+s.EnvdAccessToken)
		wantProxyError(t, "GET /health on port "+port+" of a paused sandbox", resp, b, id, msgSandboxNotFound)
	}

	// v2 connect resumes: 201, the same token.
	resp, b = e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":120}`)
	var c api.Sandbox
	json.Unmarshal(b, &c)
	if resp.StatusCode != 201 || c.SandboxID != id || c.EnvdAccessToken != s.EnvdAccessToken {
		t.Fatalf("POST connect of a paused sandbox = %d %s, want 201 with the same ID and token", resp.StatusCode, b)
	}
	after := e.info(t, id)
	if after.State != "running" || !after.StartedAt.After(before.StartedAt) ||
		after.EndAt.Sub(after.StartedAt) != 120*time.Second {
		t.Errorf("GET resumed = %+v; want running, a new start, endAt = start + 120s", after)
	}
	resp, b = e.do(t, "GET", "/health", "", "E2b-Sandbox-Id: "+id, "E2b-Sandbox-Port: 49983")
	if resp.StatusCode != 204 {
		t.Errorf("GET /health after resume = %d %s, want 204", resp.StatusCode, b)
	}
	// Connect to a running sandbox: 200, endAt never shortened.
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/connect", `{"timeout":10}`)
	if resp.StatusCode != 200 || !e.info(t, id).EndAt.Equal(after.EndAt) {
		t.Errorf("POST v1 connect of a running sandbox = %d %s, want 200 and endAt unchanged", resp.StatusCode, b)
	}

	// The older resume route: 201, 15 s by default.
	if resp, b = e.api(t, "POST", "/sandboxes/"+id+"/pause", ""); resp.StatusCode != 204 {
		t.Fatalf("second pause = %d %s", resp.StatusCode, b)
	}
	resp, b = e.api(t, "POST", "/sandboxes/"+id+"/resume", "")
	if resp.StatusCode != 201 {
		t.Fatalf("POST resume = %d %s, want 201", resp.StatusCode, b)
	}
	if d := e.info(t, id); d.State != "running" || d.EndAt.Sub(d.StartedAt) != 15*time.Second {
		t.Errorf("after resume without a timeout: %+v, want running for 15s", d)
	}

	// Kill of a paused sandbox works and leaves nothing.
	if resp, b = e.api(t, "POST", "/sandboxes/"+id+"/pause", `{"memory":true}`); resp.StatusCode != 204 {
		t.Fatalf("third pause = %d %s", resp.StatusCode, b)
	}
	if resp, b = e.api(t, "DELETE", "/sandboxes/"+id, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE paused = %d %s, want 204", resp.StatusCode, b)
	}
	if _, ok := e.host.Sandbox(id); ok {
		t.Errorf("killed paused sandbox still on the host")
	}
	resp, b = e.api(t, "POST", "/v2/sandboxes/"+id+"/connect", `{}`)
	wantError(t, "POST connect of a killed sandbox", resp, b, 404, "")
}

func (e *testEnv) fakeSandbox(t *testing.T, id string) *fake.Sandbox {
	t.Helper()
	fs, ok := e.host.Sandbox(id)
	if !ok {
		t.Fatalf("sandbox %s is not on the fake host", id)
	}
	return fs
}

func TestLifecycleAtCreate(t *testing.T) {
	e := newTestEnv(t)
	s := e.create(t, `{"templateID":"base","autoPause":true,"autoPauseMemory":true,"autoResume":{"enabled":true}}`)
	if l := e.info(t, s.SandboxID).Lifecycle; l == nil || l.OnTimeout != "pause" || !l.AutoResume {
		t.Errorf("lifecycle = %+v, want {pause, true}", l)
	}
	// Traffic to a paused sandbox with autoResume resumes it.
	if err := e.m.Pauses().Pause(t.Context(), s.SandboxID, sandbox.WithMemory); err != nil {
		t.Fatal(err)
	}
	resp, b := e.do(t, "GET", "/health", "", "E2b-Sandbox-Id: "+s.SandboxID, "E2b-Sandbox-Port: 49983")
	if resp.StatusCode != 204 {
		t.Errorf("GET /health of a paused autoResume sandbox = %d %s, want 204 (resumed)", resp.StatusCode, b)
	}
	if d := e.info(t, s.SandboxID); d.State != "running" || d.EndAt.Sub(d.StartedAt) != 5*time.Minute {
		t.Errorf("after traffic: %+v, want running with its create timeout (5m)", d)
	}
}

// TestStreamAbortOnPause: a stream in flight is cut when the sandbox is
// paused, as when it is killed.
func TestStreamAbortOnPause(t *testing.T) {
	e := newTestEnv(t, fake.Options{StreamInterval: time.Millisecond})
	s := e.create(t, `{"templateID":"base"}`)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a hang guard
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/process.Process/Start",
		strings.NewReader("\x00\x00\x00\x00\x02{}"))
	for _, h := range sbxHeaders(s.SandboxID, s.EnvdAccessToken) {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := readEnvelope(br); err != nil {
		t.Fatalf("first envelope: %v", err)
	}
	if err := e.m.Pauses().Pause(t.Context(), s.SandboxID, sandbox.WithMemory); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := readEnvelope(br)
		if err == nil {
			continue
		}
		if err == io.EOF {
			t.Errorf("stream ended cleanly after pause; want an aborted connection")
		}
		if ctx.Err() != nil {
			t.Errorf("stream still open after pause; want it aborted")
		}
		break
	}
}

// TestSignedFilesToPaused: a signed /files URL of a paused sandbox gets the
// proxy's 502 (not a signature error), or resumes it with autoResume.
func TestSignedFilesToPaused(t *testing.T) {
	e := newTestEnv(t)
	plain := e.create(t, `{"templateID":"base"}`)
	auto := e.create(t, `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`)
	signed := func(s api.Sandbox) string {
		return "/files?path=a.txt&signature=" + url.QueryEscape(fileSignature("a.txt", "read", "", s.EnvdAccessToken, nil))
	}
	// Seen once while running: the signature is in the index.
	if resp, b := e.do(t, "GET", signed(plain), ""); resp.StatusCode != 200 {
		t.Fatalf("signed read while running = %d %s", resp.StatusCode, b)
	}
	for _, s := range []api.Sandbox{plain, auto} {
		if err := e.m.Pauses().Pause(t.Context(), s.SandboxID, sandbox.WithMemory); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 { // from the index, then from a fresh scan
		resp, b := e.do(t, "GET", signed(plain), "")
		wantProxyError(t, fmt.Sprintf("signed read of a paused sandbox (%d)", i), resp, b, plain.SandboxID, msgSandboxNotFound)
	}
	resp, b := e.do(t, "GET", signed(auto), "")
	var echo fake.Echo
	if err := json.Unmarshal(b, &echo); resp.StatusCode != 200 || err != nil || echo.SandboxID != auto.SandboxID {
		t.Errorf("signed read of a paused autoResume sandbox = %d %s, want 200 (resumed)", resp.StatusCode, b)
	}
	if got := e.info(t, auto.SandboxID).State; got != "running" {
		t.Errorf("state after the signed read = %s, want running", got)
	}
}
