package client_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/client/clienttest"
)

func newClient(t *testing.T) (*clienttest.Server, *client.Client) {
	t.Helper()
	srv := clienttest.NewServer(t)
	return srv, client.New(srv.URL, srv.APIKey)
}

func lastRequest(t *testing.T, srv *clienttest.Server) clienttest.Request {
	t.Helper()
	reqs := srv.Requests()
	if len(reqs) == 0 {
		t.Fatal("server received no request")
	}
	return reqs[len(reqs)-1]
}

func TestCreate(t *testing.T) {
	srv, c := newClient(t)
	timeout := int32(60)
	sb, err := c.Create(t.Context(), api.NewSandbox{TemplateID: "minimal", Timeout: &timeout, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatalf("Create = %v", err)
	}
	if sb.ID() == "" || sb.EnvdAccessToken == "" || sb.EnvdVersion != api.EnvdVersion {
		t.Errorf("Create = %+v, want an ID, a token and envdVersion %s", sb.Sandbox, api.EnvdVersion)
	}
	r := lastRequest(t, srv)
	if r.Method != "POST" || r.Path != "/v2/sandboxes" {
		t.Errorf("Create sent %s %s, want POST /v2/sandboxes", r.Method, r.Path)
	}
	if got := r.Header.Get("X-API-Key"); got != srv.APIKey {
		t.Errorf("Create sent X-API-Key %q, want %q", got, srv.APIKey)
	}
	if got := r.Header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Create sent Content-Type %q, want application/json", got)
	}
	var body map[string]any
	if err := json.Unmarshal(r.Body, &body); err != nil {
		t.Fatalf("Create body %q: %v", r.Body, err)
	}
	if body["templateID"] != "minimal" || body["timeout"] != 60.0 || body["metadata"].(map[string]any)["k"] != "v" {
		t.Errorf("Create body = %s, want templateID minimal, timeout 60, metadata k=v", r.Body)
	}
	if _, ok := body["envVars"]; ok {
		t.Errorf("Create body = %s, want no envVars when none given", r.Body)
	}
}

func TestErrors(t *testing.T) {
	srv, c := newClient(t)
	_, err := c.Get(t.Context(), "nosuch")
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 404 || e.Code != 404 || !strings.Contains(e.Message, "nosuch") {
		t.Errorf("Get(nosuch) = %v, want *Error 404 naming the ID", err)
	}
	if !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get(nosuch) = %v, want errors.Is api.ErrNotFound", err)
	}
	if err := c.Kill(t.Context(), "nosuch"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Kill(nosuch) = %v, want api.ErrNotFound", err)
	}
	bad := client.New(srv.URL, "wrong")
	if _, err := bad.List(t.Context(), client.ListOptions{}); !errors.Is(err, api.ErrPermissionDenied) {
		t.Errorf("List with a bad key = %v, want api.ErrPermissionDenied", err)
	}
	if _, err := c.Create(t.Context(), api.NewSandbox{}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("Create without template = %v, want api.ErrInvalidArgument", err)
	}
}

func TestErrorBodies(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		want    client.Error
		wantErr error
	}{
		{"e2b", 409, `{"code":409,"message":"already paused"}`, client.Error{Status: 409, Code: 409, Message: "already paused"}, api.ErrConflict},
		{"proxy", 502, `{"sandboxId":"x","message":"The sandbox was not found","code":502}`, client.Error{Status: 502, Code: 502, Message: "The sandbox was not found"}, api.ErrUnavailable},
		{"text", 500, "boom\n", client.Error{Status: 500, Code: 500, Message: "boom"}, nil},
		{"code differs", 400, `{"code":4001,"message":"bad"}`, client.Error{Status: 400, Code: 4001, Message: "bad"}, api.ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			_, err := client.New(srv.URL, "k").Get(t.Context(), "x")
			var e *client.Error
			if !errors.As(err, &e) || *e != tt.want {
				t.Fatalf("Get with %d %q = %#v, want %#v", tt.status, tt.body, err, tt.want)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Get with %d = %v, want errors.Is %v", tt.status, err, tt.wantErr)
			}
		})
	}
}

func TestList(t *testing.T) {
	srv, c := newClient(t)
	for i := range 205 {
		md := map[string]string{"n": "x"}
		if i%2 == 0 {
			md["v w"] = "a&b=c d"
		}
		srv.AddSandbox(api.NewSandbox{TemplateID: "minimal", Metadata: md})
	}
	all, err := c.List(t.Context(), client.ListOptions{})
	if err != nil || len(all) != 205 {
		t.Fatalf("List() = %d sandboxes, %v; want 205", len(all), err)
	}
	if all[0].SandboxID <= all[1].SandboxID {
		t.Errorf("List() starts %s, %s; want newest first", all[0].SandboxID, all[1].SandboxID)
	}
	if n := len(srv.Requests()); n != 3 {
		t.Errorf("List() of 205 made %d requests, want 3 pages", n)
	}
	even, err := c.List(t.Context(), client.ListOptions{Metadata: map[string]string{"v w": "a&b=c d"}, State: []string{"running", "paused"}})
	if err != nil || len(even) != 103 {
		t.Fatalf("List(metadata) = %d sandboxes, %v; want 103", len(even), err)
	}
	r := lastRequest(t, srv)
	if got := r.Query.Get("state"); got != "running,paused" {
		t.Errorf("List sent state=%q, want running,paused", got)
	}
	limited, err := c.List(t.Context(), client.ListOptions{Limit: 7})
	if err != nil || len(limited) != 7 {
		t.Fatalf("List(Limit 7) = %d, %v; want 7", len(limited), err)
	}
	if got := lastRequest(t, srv).Query.Get("limit"); got != "7" {
		t.Errorf("List(Limit 7) sent limit=%q, want 7", got)
	}
	page, next, err := c.ListPage(t.Context(), client.ListOptions{Limit: 2})
	if err != nil || len(page) != 2 || next == "" {
		t.Fatalf("ListPage(Limit 2) = %d, %q, %v; want 2 and a next token", len(page), next, err)
	}
	page2, _, err := c.ListPage(t.Context(), client.ListOptions{Limit: 2, NextToken: next})
	if err != nil || len(page2) != 2 || page2[0].SandboxID == page[0].SandboxID {
		t.Errorf("ListPage(next) = %v, %v; want the next 2", page2, err)
	}
}

// TestListMetadataWire checks the metadata filter's wire form against the
// capture in the protocol reference (§1.6).
func TestListMetadataWire(t *testing.T) {
	var raw string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw = r.URL.RawQuery
		w.Write([]byte("[]"))
	}))
	defer srv.Close()
	if _, err := client.New(srv.URL, "k").List(t.Context(), client.ListOptions{Metadata: map[string]string{"k": "v w"}}); err != nil {
		t.Fatal(err)
	}
	if want := "metadata=k%3Dv%252520w"; raw != want {
		t.Errorf("List(metadata k=v w) query = %q, want %q", raw, want)
	}
}

func TestKillTimeoutConnect(t *testing.T) {
	srv, c := newClient(t)
	id, token := srv.AddSandbox(api.NewSandbox{TemplateID: "minimal"})
	if err := c.SetTimeout(t.Context(), id, 1500*time.Millisecond); err != nil {
		t.Fatalf("SetTimeout = %v", err)
	}
	r := lastRequest(t, srv)
	if r.Path != "/sandboxes/"+id+"/timeout" || strings.TrimSpace(string(r.Body)) != `{"timeout":2}` {
		t.Errorf("SetTimeout(1.5s) sent %s %s, want /sandboxes/%s/timeout {\"timeout\":2}", r.Path, r.Body, id)
	}
	sb, err := c.Connect(t.Context(), id, time.Minute)
	if err != nil || sb.EnvdAccessToken != token {
		t.Fatalf("Connect = %+v, %v; want token %s", sb, err, token)
	}
	if r := lastRequest(t, srv); r.Path != "/v2/sandboxes/"+id+"/connect" || strings.TrimSpace(string(r.Body)) != `{"timeout":60}` {
		t.Errorf("Connect sent %s %s", r.Path, r.Body)
	}
	d, err := c.Get(t.Context(), id)
	if err != nil || d.SandboxID != id || d.State != "running" || d.EnvdAccessToken != token {
		t.Errorf("Get = %+v, %v", d, err)
	}
	if err := sb.Kill(t.Context()); err != nil {
		t.Fatalf("Kill = %v", err)
	}
	if r := lastRequest(t, srv); r.Method != "DELETE" || r.Path != "/sandboxes/"+id {
		t.Errorf("Kill sent %s %s", r.Method, r.Path)
	}
	if _, err := c.Get(t.Context(), id); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("Get after Kill = %v, want api.ErrNotFound", err)
	}
}
