package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/fencesandbox/fence/api"
)

// userAgent identifies this SDK on the wire.
const userAgent = "fence-go-sdk/1"

// Client is a client of the fence control plane. Create one with New.
type Client struct {
	baseURL    string
	sandboxURL string
	apiKey     string
	http       *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client use hc for every request, envd streams
// included. hc must not set a Timeout, which would cut long streams; use
// contexts instead. Without this option the client uses a fresh
// *http.Client with no proxy from the environment.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.http = hc }
}

// WithSandboxURL sets the base URL of sandbox (envd) traffic, the
// counterpart of the SDKs' E2B_SANDBOX_URL. Without this option sandbox
// traffic goes to the control-plane base URL, which fence serves on the same
// listener.
func WithSandboxURL(u string) Option {
	return func(c *Client) { c.sandboxURL = strings.TrimRight(u, "/") }
}

// New returns a client of the daemon at baseURL (e.g.
// "http://127.0.0.1:3000") that authenticates with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		baseURL: strings.TrimRight(baseURL, "/"),
		apiKey:  apiKey,
	}
	for _, o := range opts {
		o(c)
	}
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: false}}
	}
	if c.sandboxURL == "" {
		c.sandboxURL = c.baseURL
	}
	return c
}

// authorize puts the client's credential on req: an access token
// (sk_e2b_…) as a Bearer token, an API key in X-API-Key.
func (c *Client) authorize(req *http.Request) {
	if strings.HasPrefix(c.apiKey, "sk_e2b_") {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
		return
	}
	req.Header.Set(api.HeaderAPIKey, c.apiKey)
}

// do sends a control-plane request with a JSON body (when in is not nil) and
// decodes a JSON response into out (when out is not nil). A status outside
// okStatus is turned into *Error.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any, okStatus ...int) (*http.Response, error) {
	return c.doWith(ctx, nil, method, path, query, in, out, okStatus...)
}

// doWith is do with extra request headers.
func (c *Client) doWith(ctx context.Context, hdr http.Header, method, path string, query url.Values, in, out any, okStatus ...int) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encoding request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	u := c.baseURL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	c.authorize(req)
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	ok := false
	for _, s := range okStatus {
		ok = ok || resp.StatusCode == s
	}
	if !ok {
		return resp, decodeError(resp)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp, fmt.Errorf("decoding %s %s response: %w", method, path, err)
		}
	}
	return resp, nil
}
