package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/fencesandbox/fence/api"
)

// CreateVolume makes a volume named name of sizeMB MiB (0: the daemon's
// default).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (*api.VolumeAndToken, error) {
	var out api.VolumeAndToken
	if _, err := c.do(ctx, http.MethodPost, "/volumes", nil, api.NewVolume{Name: name, SizeMB: sizeMB}, &out, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("creating volume: %w", err)
	}
	return &out, nil
}

// Volumes lists the team's volumes.
func (c *Client) Volumes(ctx context.Context) ([]api.Volume, error) {
	var out []api.Volume
	if _, err := c.do(ctx, http.MethodGet, "/volumes", nil, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("listing volumes: %w", err)
	}
	return out, nil
}

// DeleteVolume deletes the volume id and its content.
func (c *Client) DeleteVolume(ctx context.Context, id string) error {
	if _, err := c.do(ctx, http.MethodDelete, "/volumes/"+url.PathEscape(id), nil, nil, nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	return nil
}
