package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/fencesandbox/fence/api"
)

// Teams, API keys and access tokens. The admin (the daemon's bootstrap
// key) names a team with team; "" is the caller's own team. A key's or
// token's value is returned once, by the call that makes it.

// teamHeader is the X-Team-ID header of team, nil for "".
func teamHeader(team string) http.Header {
	if team == "" {
		return nil
	}
	return http.Header{"X-Team-Id": {team}}
}

// Teams lists every team (GET /admin/teams; admin only).
func (c *Client) Teams(ctx context.Context) ([]api.TeamInfo, error) {
	var out []api.TeamInfo
	if _, err := c.do(ctx, http.MethodGet, "/admin/teams", nil, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("listing teams: %w", err)
	}
	return out, nil
}

// CreateTeam makes a team (POST /admin/teams; admin only).
func (c *Client) CreateTeam(ctx context.Context, name string) (*api.TeamInfo, error) {
	var out api.TeamInfo
	if _, err := c.do(ctx, http.MethodPost, "/admin/teams", nil, api.NewTeam{Name: name}, &out, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("creating team: %w", err)
	}
	return &out, nil
}

// CreateAPIKey makes an API key named name for team.
func (c *Client) CreateAPIKey(ctx context.Context, team, name string) (*api.CreatedTeamAPIKey, error) {
	return c.CreateAPIKeyWithRole(ctx, team, name, "")
}

// CreateAPIKeyWithRole is CreateAPIKey of a key with role ("auditor":
// it reads its team's audit trail, usage, metrics and lists alone; ""
// a full key).
func (c *Client) CreateAPIKeyWithRole(ctx context.Context, team, name, role string) (*api.CreatedTeamAPIKey, error) {
	var out api.CreatedTeamAPIKey
	path := "/api-keys"
	if team != "" {
		path = "/admin/teams/" + url.PathEscape(team) + "/api-keys"
	}
	if _, err := c.do(ctx, http.MethodPost, path, nil, api.NewTeamAPIKey{Name: name, Role: role}, &out, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("creating API key: %w", err)
	}
	return &out, nil
}

// APIKeys lists team's live API keys, masked.
func (c *Client) APIKeys(ctx context.Context, team string) ([]api.TeamAPIKey, error) {
	var out []api.TeamAPIKey
	path := "/api-keys"
	if team != "" {
		path = "/admin/teams/" + url.PathEscape(team) + "/api-keys"
	}
	if _, err := c.do(ctx, http.MethodGet, path, nil, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("listing API keys: %w", err)
	}
	return out, nil
}

// RevokeAPIKey revokes team's API key id: it stops working at once.
func (c *Client) RevokeAPIKey(ctx context.Context, team, id string) error {
	path := "/api-keys/" + url.PathEscape(id)
	if team != "" {
		path = "/admin/teams/" + url.PathEscape(team) + "/api-keys/" + url.PathEscape(id)
	}
	if _, err := c.do(ctx, http.MethodDelete, path, nil, nil, nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("revoking API key %s: %w", id, err)
	}
	return nil
}

// CreateAccessToken makes an access token named name for team.
func (c *Client) CreateAccessToken(ctx context.Context, team, name string) (*api.CreatedAccessToken, error) {
	var out api.CreatedAccessToken
	if _, err := c.doWith(ctx, teamHeader(team), http.MethodPost, "/access-tokens", nil, api.NewTeamAPIKey{Name: name}, &out, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("creating access token: %w", err)
	}
	return &out, nil
}

// AccessTokens lists team's live access tokens, masked.
func (c *Client) AccessTokens(ctx context.Context, team string) ([]api.AccessToken, error) {
	var out []api.AccessToken
	if _, err := c.doWith(ctx, teamHeader(team), http.MethodGet, "/access-tokens", nil, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("listing access tokens: %w", err)
	}
	return out, nil
}

// RevokeAccessToken revokes team's access token id.
func (c *Client) RevokeAccessToken(ctx context.Context, team, id string) error {
	if _, err := c.doWith(ctx, teamHeader(team), http.MethodDelete, "/access-tokens/"+url.PathEscape(id), nil, nil, nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("revoking access token %s: %w", id, err)
	}
	return nil
}

// TeamLimits reads team's limits (GET /teams/{teamID}/limits) as the
// daemon writes them.
func (c *Client) TeamLimits(ctx context.Context, team string) (map[string]any, error) {
	var out map[string]any
	if _, err := c.do(ctx, http.MethodGet, "/teams/"+url.PathEscape(team)+"/limits", nil, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("reading the limits of team %s: %w", team, err)
	}
	return out, nil
}

// SetTeamLimits replaces team's limits (PUT /teams/{teamID}/limits) and
// returns them as the daemon now keeps them.
func (c *Client) SetTeamLimits(ctx context.Context, team string, limits map[string]any) (map[string]any, error) {
	var out map[string]any
	if _, err := c.do(ctx, http.MethodPut, "/teams/"+url.PathEscape(team)+"/limits", nil, limits, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("setting the limits of team %s: %w", team, err)
	}
	return out, nil
}
