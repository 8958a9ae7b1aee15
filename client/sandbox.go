package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
)

// Sandbox is a handle on one sandbox: the create/connect response plus the
// client that made it.
type Sandbox struct {
	api.Sandbox
	c *Client
}

// Sandbox returns a handle on an existing sandbox without a request.
// accessToken is its envdAccessToken (from Get or Create), or "" if it has
// none.
func (c *Client) Sandbox(id, accessToken string) *Sandbox {
	return &Sandbox{Sandbox: api.Sandbox{SandboxID: id, EnvdAccessToken: accessToken}, c: c}
}

// ID returns the sandbox ID.
func (s *Sandbox) ID() string { return s.SandboxID }

// Kill kills the sandbox.
func (s *Sandbox) Kill(ctx context.Context) error { return s.c.Kill(ctx, s.SandboxID) }

// SetTimeout sets the sandbox's time to live, counted from now.
func (s *Sandbox) SetTimeout(ctx context.Context, d time.Duration) error {
	return s.c.SetTimeout(ctx, s.SandboxID, d)
}

// Envd returns a client of the sandbox's agent, routed through the daemon by
// the E2b-Sandbox-Id and E2b-Sandbox-Port headers and authenticated with the
// sandbox's access token.
func (s *Sandbox) Envd() *Envd {
	h := http.Header{}
	h.Set(api.HeaderSandboxID, s.SandboxID)
	h.Set(api.HeaderSandboxPort, strconv.Itoa(api.EnvdPort))
	if s.EnvdAccessToken != "" {
		h.Set(api.HeaderAccessToken, s.EnvdAccessToken)
	}
	return NewEnvd(s.c.http, s.c.sandboxURL, h)
}

// Create creates a sandbox (POST /v2/sandboxes).
func (c *Client) Create(ctx context.Context, req api.NewSandbox) (*Sandbox, error) {
	s := &Sandbox{c: c}
	if _, err := c.do(ctx, http.MethodPost, "/v2/sandboxes", nil, req, &s.Sandbox, http.StatusCreated, http.StatusOK); err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	return s, nil
}

// Connect connects to a sandbox, resuming it if it is paused
// (POST /v2/sandboxes/{id}/connect). A timeout above zero extends its time
// to live to at least that long from now; zero leaves the daemon's default.
func (c *Client) Connect(ctx context.Context, id string, timeout time.Duration) (*Sandbox, error) {
	var req api.ConnectRequest
	if timeout > 0 {
		t := seconds(timeout)
		req.Timeout = &t
	}
	s := &Sandbox{c: c}
	if _, err := c.do(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", nil, req, &s.Sandbox, http.StatusOK, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("connecting to sandbox %s: %w", id, err)
	}
	return s, nil
}

// Pause pauses a running sandbox in place (POST /sandboxes/{id}/pause):
// its processes stop with their memory until Connect resumes it. Pausing a
// paused sandbox is an error that is api.ErrConflict.
func (c *Client) Pause(ctx context.Context, id string) error {
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, api.PauseRequest{}, nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return nil
}

// Get returns a sandbox's details (GET /sandboxes/{id}).
func (c *Client) Get(ctx context.Context, id string) (*api.SandboxDetail, error) {
	var d api.SandboxDetail
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, nil, &d, http.StatusOK); err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", id, err)
	}
	return &d, nil
}

// Kill kills a sandbox (DELETE /sandboxes/{id}). Killing an unknown sandbox
// returns an error that is api.ErrNotFound.
func (c *Client) Kill(ctx context.Context, id string) error {
	if _, err := c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil, nil, http.StatusNoContent, http.StatusOK); err != nil {
		return fmt.Errorf("killing sandbox %s: %w", id, err)
	}
	return nil
}

// SetTimeout sets a sandbox's time to live to d from now
// (POST /sandboxes/{id}/timeout). It may shorten it. d is rounded up to
// whole seconds.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	req := api.TimeoutRequest{Timeout: seconds(d)}
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", nil, req, nil, http.StatusNoContent, http.StatusOK); err != nil {
		return fmt.Errorf("setting timeout of sandbox %s: %w", id, err)
	}
	return nil
}

// seconds rounds d up to whole seconds, as the SDKs do (ceil(ms/1000)).
func seconds(d time.Duration) int32 {
	s := (d + time.Second - 1) / time.Second
	if s > 1<<31-1 {
		return 1<<31 - 1
	}
	return int32(s)
}

// ListOptions selects sandboxes for List.
type ListOptions struct {
	// Metadata keeps sandboxes whose metadata has all of these pairs.
	Metadata map[string]string
	// State keeps sandboxes in these states ("running", "paused"); empty
	// means all.
	State []string
	// Limit caps the number of sandboxes List returns; zero means all. For
	// ListPage it is the page size (the daemon's default when zero).
	Limit int
	// NextToken continues a listing (ListPage only): the token a previous
	// page returned.
	NextToken string
}

// maxPage is the largest page the API serves.
const maxPage = 100

// List lists sandboxes (GET /v2/sandboxes), following X-Next-Token until the
// last page or until Limit sandboxes were read.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]api.ListedSandbox, error) {
	var all []api.ListedSandbox
	page := opts
	page.NextToken = ""
	for {
		page.Limit = 0
		if opts.Limit > 0 {
			page.Limit = min(opts.Limit-len(all), maxPage)
		}
		items, next, err := c.ListPage(ctx, page)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" || (opts.Limit > 0 && len(all) >= opts.Limit) {
			break
		}
		page.NextToken = next
	}
	if opts.Limit > 0 && len(all) > opts.Limit {
		all = all[:opts.Limit]
	}
	return all, nil
}

// ListPage reads one page of sandboxes and returns the token of the next
// page, or "" on the last page.
func (c *Client) ListPage(ctx context.Context, opts ListOptions) ([]api.ListedSandbox, string, error) {
	q := url.Values{}
	if len(opts.Metadata) > 0 {
		q.Set("metadata", encodeMetadata(opts.Metadata))
	}
	if len(opts.State) > 0 {
		q.Set("state", strings.Join(opts.State, ","))
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.NextToken != "" {
		q.Set("nextToken", opts.NextToken)
	}
	var items []api.ListedSandbox
	resp, err := c.do(ctx, http.MethodGet, "/v2/sandboxes", q, nil, &items, http.StatusOK)
	if err != nil {
		return nil, "", fmt.Errorf("listing sandboxes: %w", err)
	}
	return items, resp.Header.Get(api.HeaderNextToken), nil
}

// encodeMetadata encodes a metadata filter the way the E2B SDKs do: each key
// and value escaped like encodeURIComponent, joined as a form
// (k=v&k2=v2) that is form-encoded once more; the query encoding then adds
// the outer layer.
func encodeMetadata(md map[string]string) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(uriComponent(k)))
		b.WriteByte('=')
		b.WriteString(url.QueryEscape(uriComponent(md[k])))
	}
	return b.String()
}

// uriComponent escapes s like JavaScript's encodeURIComponent.
func uriComponent(s string) string {
	e := url.QueryEscape(s)
	r := strings.NewReplacer("+", "%20", "%21", "!", "%27", "'", "%28", "(", "%29", ")", "%2A", "*", "%7E", "~")
	return r.Replace(e)
}
