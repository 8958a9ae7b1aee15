package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/fencesandbox/fence/api"
)

// Secrets. A secret's value is write-only: these methods send it, and no
// method returns it. A secret is named by its ID (sec_…) or its name.

// CreateSecret stores a new secret (POST /secrets). A taken name is an
// error that is api.ErrConflict.
func (c *Client) CreateSecret(ctx context.Context, name, value string, metadata map[string]string) (*api.Secret, error) {
	var s api.Secret
	req := api.NewSecret{Name: name, Value: &value, Metadata: metadata}
	if _, err := c.do(ctx, http.MethodPost, "/secrets", nil, req, &s, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("creating secret: %w", err)
	}
	return &s, nil
}

// UpdateSecret stores value as the secret's next version
// (POST /secrets/{secretID}). A nil metadata keeps the stored one; a
// non-nil one (even empty) replaces it.
func (c *Client) UpdateSecret(ctx context.Context, secret, value string, metadata map[string]string) (*api.Secret, error) {
	var s api.Secret
	req := api.SecretUpdate{Value: &value, Metadata: metadata}
	if _, err := c.do(ctx, http.MethodPost, "/secrets/"+url.PathEscape(secret), nil, req, &s, http.StatusOK); err != nil {
		return nil, fmt.Errorf("updating secret %s: %w", secret, err)
	}
	return &s, nil
}

// GetSecret returns what the daemon tells about a secret
// (GET /secrets/{secretID}).
func (c *Client) GetSecret(ctx context.Context, secret string) (*api.Secret, error) {
	var s api.Secret
	if _, err := c.do(ctx, http.MethodGet, "/secrets/"+url.PathEscape(secret), nil, nil, &s, http.StatusOK); err != nil {
		return nil, fmt.Errorf("getting secret %s: %w", secret, err)
	}
	return &s, nil
}

// DeleteSecret removes a secret (DELETE /secrets/{secretID}). An unknown
// secret is an error that is api.ErrNotFound.
func (c *Client) DeleteSecret(ctx context.Context, secret string) error {
	if _, err := c.do(ctx, http.MethodDelete, "/secrets/"+url.PathEscape(secret), nil, nil, nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("deleting secret %s: %w", secret, err)
	}
	return nil
}

// ListSecrets lists every secret, newest first (GET /secrets, following
// X-Next-Token).
func (c *Client) ListSecrets(ctx context.Context) ([]api.Secret, error) {
	var all []api.Secret
	token := ""
	for {
		page, next, err := c.ListSecretsPage(ctx, maxPage, token)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == "" {
			return all, nil
		}
		token = next
	}
}

// ListSecretsPage reads one page of secrets (limit 1..100; 0 means the
// daemon's default) and returns the next page's token, or "" on the last.
func (c *Client) ListSecretsPage(ctx context.Context, limit int, token string) ([]api.Secret, string, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if token != "" {
		q.Set("nextToken", token)
	}
	var page []api.Secret
	resp, err := c.do(ctx, http.MethodGet, "/secrets", q, nil, &page, http.StatusOK)
	if err != nil {
		return nil, "", fmt.Errorf("listing secrets: %w", err)
	}
	return page, resp.Header.Get(api.HeaderNextToken), nil
}

// Downloads returns the package artifacts a sandbox fetched through the
// egress gateway, oldest first (GET /sandboxes/{id}/downloads). They are
// kept after the sandbox is killed.
func (c *Client) Downloads(ctx context.Context, sandboxID string) ([]api.Download, error) {
	var out []api.Download
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(sandboxID)+"/downloads", nil, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("listing downloads of sandbox %s: %w", sandboxID, err)
	}
	return out, nil
}
