package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/fencesandbox/fence/api"
)

// PauseWithoutMemory pauses a sandbox keeping only its filesystem
// (POST /sandboxes/{id}/pause with memory false): its processes end and
// Connect boots it anew on its files, with the same ID and token.
func (c *Client) PauseWithoutMemory(ctx context.Context, id string) error {
	f := false
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, api.PauseRequest{Memory: &f}, nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return nil
}

// CreateSnapshot takes a persistent snapshot of a running sandbox's
// filesystem (POST /sandboxes/{id}/snapshots); name may be empty. Create
// with the snapshot's ID as TemplateID boots sandboxes on it.
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (*api.SnapshotInfo, error) {
	var req api.SnapshotRequest
	if name != "" {
		req.Name = &name
	}
	var out api.SnapshotInfo
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots", nil, req, &out, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	return &out, nil
}

// ListSnapshots lists snapshots (GET /snapshots), newest first, filtered
// by the sandbox they were taken from and by name when not empty.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID, name string) ([]api.SnapshotInfo, error) {
	q := url.Values{}
	if sandboxID != "" {
		q.Set("sandboxID", sandboxID)
	}
	if name != "" {
		q.Set("name", name)
	}
	var out []api.SnapshotInfo
	if _, err := c.do(ctx, http.MethodGet, "/snapshots", q, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("listing snapshots: %w", err)
	}
	return out, nil
}

// DeleteSnapshot deletes a snapshot (DELETE /templates/{snapshotID}).
// Sandboxes made from it run on.
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if _, err := c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(snapshotID), nil, nil, nil, http.StatusNoContent); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", snapshotID, err)
	}
	return nil
}

// Fork starts count copies of a running sandbox's filesystem, each with
// timeout (zero: the daemon's default of 15 s), POST /sandboxes/{id}/fork.
// It returns one entry per fork, in order: a sandbox or an error.
func (c *Client) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]*Sandbox, []error, error) {
	n := int32(count)
	req := api.ForkRequest{Count: &n}
	if timeout > 0 {
		t := seconds(timeout)
		req.Timeout = &t
	}
	var res []api.ForkResult
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", nil, req, &res, http.StatusCreated); err != nil {
		return nil, nil, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	boxes := make([]*Sandbox, len(res))
	errs := make([]error, len(res))
	for i, r := range res {
		switch {
		case r.Sandbox != nil:
			boxes[i] = &Sandbox{c: c, Sandbox: *r.Sandbox}
		case r.Error != nil:
			errs[i] = fmt.Errorf("fork %d of sandbox %s: %s (%d)", i, id, r.Error.Message, r.Error.Code)
		default:
			errs[i] = fmt.Errorf("fork %d of sandbox %s: no sandbox in the answer", i, id)
		}
	}
	return boxes, errs, nil
}

// Checkpoint checkpoints a running sandbox's filesystem (fence's
// extension, POST /sandboxes/{id}/checkpoints); name may be empty.
func (c *Client) Checkpoint(ctx context.Context, id, name string) (*api.Checkpoint, error) {
	var out api.Checkpoint
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/checkpoints", nil, api.CheckpointRequest{Name: name}, &out, http.StatusCreated); err != nil {
		return nil, fmt.Errorf("checkpointing sandbox %s: %w", id, err)
	}
	return &out, nil
}

// Checkpoints lists a sandbox's checkpoints, oldest first.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]api.Checkpoint, error) {
	var out []api.Checkpoint
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/checkpoints", nil, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("listing checkpoints of sandbox %s: %w", id, err)
	}
	return out, nil
}

// Diff lists the paths that differ between two states of a sandbox: from
// and to are checkpoint IDs or names; from "" means as created, to "" as
// it is now.
func (c *Client) Diff(ctx context.Context, id, from, to string) ([]api.FileDiff, error) {
	q := url.Values{}
	if from != "" {
		q.Set("from", from)
	}
	if to != "" {
		q.Set("to", to)
	}
	var out []api.FileDiff
	if _, err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/diff", q, nil, &out, http.StatusOK); err != nil {
		return nil, fmt.Errorf("diffing sandbox %s: %w", id, err)
	}
	return out, nil
}

// Rewind reboots a running sandbox on one of its checkpoints (by ID or
// name): its files are the checkpoint's again, its processes start anew;
// ID, token, deadline, environment, metadata and network stay.
func (c *Client) Rewind(ctx context.Context, id, checkpoint string) error {
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/rewind", nil, api.RewindRequest{CheckpointID: checkpoint}, nil, http.StatusOK); err != nil {
		return fmt.Errorf("rewinding sandbox %s: %w", id, err)
	}
	return nil
}
