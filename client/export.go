package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// Export writes the forensics archive (tar.gz) of a sandbox, running,
// paused or killed within the daemon's retention, to w
// (GET /sandboxes/{id}/export). An archive cut short is an error.
func (c *Client) Export(ctx context.Context, sandboxID string, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+"/sandboxes/"+url.PathEscape(sandboxID)+"/export", nil)
	if err != nil {
		return 0, fmt.Errorf("building request: %w", err)
	}
	c.authorize(req)
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("exporting sandbox %s: %w", sandboxID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("exporting sandbox %s: %w", sandboxID, decodeError(resp))
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("exporting sandbox %s: the archive was cut short: %w", sandboxID, err)
	}
	return n, nil
}

// Usage returns the usage report of GET /usage; query may hold sandbox,
// since and until.
func (c *Client) Usage(ctx context.Context, query url.Values, out any) error {
	if _, err := c.do(ctx, http.MethodGet, "/usage", query, nil, out, http.StatusOK); err != nil {
		return fmt.Errorf("reading usage: %w", err)
	}
	return nil
}
