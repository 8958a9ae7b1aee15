package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/fencesandbox/fence/api"
)

// ListApprovals lists the pending egress approval requests, oldest first
// (GET /approvals).
func (c *Client) ListApprovals(ctx context.Context) ([]api.ApprovalRequest, error) {
	var out []api.ApprovalRequest
	_, err := c.do(ctx, "GET", "/approvals", nil, nil, &out, http.StatusOK)
	return out, err
}

// DecideApproval decides request id: "once", "sandbox", "team" or "deny"
// (POST /approvals/{id}).
func (c *Client) DecideApproval(ctx context.Context, id, decision string) (api.ApprovalRequest, error) {
	var out api.ApprovalRequest
	_, err := c.do(ctx, "POST", "/approvals/"+url.PathEscape(id), nil, api.ApprovalDecision{Decision: decision}, &out, http.StatusOK)
	return out, err
}
