// Package clienttest provides fakes of a fence daemon and of a sandbox
// agent, served by net/http/httptest, for tests of code that uses package
// client (the SDK's own tests and the CLI's).
//
// The fakes speak the real wire protocol (E2B REST JSON, Connect with the
// JSON codec, /files) and check what a real daemon checks: the API key, the
// sandbox routing headers and the envd access token. They record every
// request so tests can assert what a client sent.
//
// Processes are simulated by a small set of built-in commands (see
// Agent); nothing is executed on the host.
package clienttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// Request is one request a fake received.
type Request struct {
	Method string
	Path   string
	Query  url.Values
	Header http.Header
	Body   []byte // control-plane and /files bodies; nil for Connect RPCs
}

// Server is a fake fence daemon: the control plane plus envd traffic
// routed by E2b-Sandbox-Id / E2b-Sandbox-Port to one fake Agent per sandbox.
type Server struct {
	URL    string // base URL of the daemon
	APIKey string // the only key accepted

	srv *httptest.Server

	mu sync.Mutex
	// +checklocks:mu
	sandboxes map[string]*fakeSandbox
	// +checklocks:mu
	order []string // creation order
	// +checklocks:mu
	next int
	// +checklocks:mu
	requests []Request
}

type fakeSandbox struct {
	detail api.SandboxDetail
	token  string
	agent  *Agent
}

// NewServer starts a fake daemon that is closed when the test ends.
func NewServer(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{APIKey: "e2b_0123456789abcdef", sandboxes: map[string]*fakeSandbox{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/sandboxes", s.create)
	mux.HandleFunc("GET /v2/sandboxes", s.list)
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.timeout)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(api.HeaderSandboxID) != "" {
			s.route(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		s.record(r, body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		if r.Header.Get(api.HeaderAPIKey) != s.APIKey {
			writeError(w, http.StatusUnauthorized, "invalid API key")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	tb.Cleanup(s.srv.Close)
	s.URL = s.srv.URL
	return s
}

func (s *Server) record(r *http.Request, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone(), Body: body})
}

// Requests returns the control-plane requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// Agent returns the fake agent of a sandbox, or nil.
func (s *Server) Agent(id string) *Agent {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb := s.sandboxes[id]; sb != nil {
		return sb.agent
	}
	return nil
}

// AddSandbox adds a running sandbox directly and returns its ID and access
// token.
func (s *Server) AddSandbox(req api.NewSandbox) (id, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	id = fmt.Sprintf("sbx%04d", s.next)
	token = fmt.Sprintf("tok%04d", s.next)
	now := time.Date(2026, 1, 1, 0, 0, s.next, 0, time.UTC)
	timeout := int32(300)
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	d := api.SandboxDetail{ListedSandbox: api.ListedSandbox{
		SandboxID: id, TemplateID: req.TemplateID, ClientID: api.ClientID,
		CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024, EnvdVersion: api.EnvdVersion,
		StartedAt: now, EndAt: now.Add(time.Duration(timeout) * time.Second),
		State: "running", Metadata: req.Metadata,
	}, EnvdAccessToken: token}
	s.sandboxes[id] = &fakeSandbox{detail: d, token: token, agent: NewAgent()}
	s.order = append(s.order, id)
	return id, token
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req api.NewSandbox
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	id, token := s.AddSandbox(req)
	writeJSON(w, http.StatusCreated, api.Sandbox{SandboxID: id, TemplateID: req.TemplateID, ClientID: api.ClientID, EnvdVersion: api.EnvdVersion, EnvdAccessToken: token})
}

func (s *Server) lookup(w http.ResponseWriter, id string) *fakeSandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	if sb == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
	}
	return sb
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	if sb := s.lookup(w, r.PathValue("id")); sb != nil {
		s.mu.Lock()
		d := sb.detail
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, d)
	}
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	if sb := s.lookup(w, r.PathValue("id")); sb != nil {
		s.mu.Lock()
		delete(s.sandboxes, sb.detail.SandboxID)
		s.order = slices.DeleteFunc(s.order, func(id string) bool { return id == sb.detail.SandboxID })
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) timeout(w http.ResponseWriter, r *http.Request) {
	var req api.TimeoutRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Timeout < 0 {
		writeError(w, http.StatusBadRequest, "invalid timeout")
		return
	}
	if sb := s.lookup(w, r.PathValue("id")); sb != nil {
		s.mu.Lock()
		sb.detail.EndAt = sb.detail.StartedAt.Add(time.Duration(req.Timeout) * time.Second)
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	if sb := s.lookup(w, r.PathValue("id")); sb != nil {
		s.mu.Lock()
		d := sb.detail
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, api.Sandbox{SandboxID: d.SandboxID, TemplateID: d.TemplateID, ClientID: api.ClientID, EnvdVersion: api.EnvdVersion, EnvdAccessToken: sb.token})
	}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	md, err := parseMetadata(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var states []string
	if st := q.Get("state"); st != "" {
		states = strings.Split(st, ",")
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > 100 {
			writeError(w, http.StatusBadRequest, "invalid limit")
			return
		}
	}
	start := 0
	if t := q.Get("nextToken"); t != "" {
		if start, err = strconv.Atoi(t); err != nil {
			writeError(w, http.StatusBadRequest, "invalid nextToken")
			return
		}
	}
	s.mu.Lock()
	var match []api.ListedSandbox
	for i := len(s.order) - 1; i >= 0; i-- { // newest first
		d := s.sandboxes[s.order[i]].detail.ListedSandbox
		if len(states) > 0 && !slices.Contains(states, d.State) {
			continue
		}
		ok := true
		for k, v := range md {
			ok = ok && d.Metadata[k] == v
		}
		if ok {
			match = append(match, d)
		}
	}
	s.mu.Unlock()
	page := []api.ListedSandbox{}
	if start < len(match) {
		page = match[start:min(start+limit, len(match))]
	}
	if start+limit < len(match) {
		w.Header().Set(api.HeaderNextToken, strconv.Itoa(start+limit))
	}
	writeJSON(w, http.StatusOK, page)
}

// parseMetadata decodes the metadata filter as E2B's API does (reference
// §2.5): unescape, split pairs on & and =, unescape each side.
func parseMetadata(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	s, err := url.QueryUnescape(v)
	if err != nil {
		return nil, fmt.Errorf("invalid metadata: %w", err)
	}
	md := map[string]string{}
	for pair := range strings.SplitSeq(s, "&") {
		kv := strings.Split(pair, "=")
		if len(kv) != 2 {
			return nil, fmt.Errorf("invalid metadata pair %q", pair)
		}
		k, err1 := url.QueryUnescape(kv[0])
		val, err2 := url.QueryUnescape(kv[1])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("invalid metadata pair %q", pair)
		}
		md[k] = val
	}
	return md, nil
}

// route forwards sandbox traffic to the sandbox's agent, after the checks
// the daemon's proxy makes.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(api.HeaderSandboxID)
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil || r.Header.Get(api.HeaderSandboxPort) != strconv.Itoa(api.EnvdPort) {
		writeJSON(w, http.StatusBadGateway, api.ProxyError{SandboxID: id, Message: "The sandbox was not found", Code: 502})
		return
	}
	if r.URL.Path != "/health" && r.Header.Get(api.HeaderAccessToken) != sb.token {
		writeError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
		return
	}
	sb.agent.ServeHTTP(w, r)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, api.Error{Code: status, Message: msg})
}

// epoch is the modification time of every fake file.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
