package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/api"
)

// ReadInput is read_file's input.
type ReadInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's ID"`
	Path      string `json:"path" jsonschema:"the file's path (relative paths start at the user's home)"`
	MaxBytes  int64  `json:"max_bytes,omitempty" jsonschema:"read at most this many bytes (default and most 1048576)"`
}

// ReadOutput is read_file's answer.
type ReadOutput struct {
	Content   string `json:"content"`
	Encoding  string `json:"encoding" jsonschema:"utf8 or base64"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"the file is longer than max_bytes"`
}

func (t *tools) readFile(ctx context.Context, _ *sdk.CallToolRequest, in ReadInput) (ReadOutput, error) {
	if in.Path == "" {
		return ReadOutput{}, inputErrorf("path is required")
	}
	if in.MaxBytes < 0 || in.MaxBytes > ReadCap {
		return ReadOutput{}, inputErrorf("max_bytes must be between 0 and %d", ReadCap)
	}
	limit := in.MaxBytes
	if limit == 0 {
		limit = ReadCap
	}
	e, err := t.envd(ctx, in.SandboxID)
	if err != nil {
		return ReadOutput{}, err
	}
	rc, err := e.ReadFile(ctx, in.Path)
	if err != nil {
		return ReadOutput{}, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return ReadOutput{}, err
	}
	out := ReadOutput{Truncated: int64(len(b)) > limit}
	b = b[:min(int64(len(b)), limit)]
	if utf8.Valid(b) {
		out.Content, out.Encoding = string(b), "utf8"
	} else {
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(b), "base64"
	}
	return out, nil
}

// WriteInput is write_file's input.
type WriteInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's ID"`
	Path      string `json:"path" jsonschema:"the file's path (relative paths start at the user's home)"`
	Content   string `json:"content" jsonschema:"the file's content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf8 (the default) or base64"`
}

// WriteOutput is write_file's answer.
type WriteOutput struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

func (t *tools) writeFile(ctx context.Context, _ *sdk.CallToolRequest, in WriteInput) (WriteOutput, error) {
	if in.Path == "" {
		return WriteOutput{}, inputErrorf("path is required")
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return WriteOutput{}, inputErrorf("content is not base64: %v", err)
		}
	default:
		return WriteOutput{}, inputErrorf("encoding %q: want utf8 or base64", in.Encoding)
	}
	e, err := t.envd(ctx, in.SandboxID)
	if err != nil {
		return WriteOutput{}, err
	}
	if err := e.WriteFile(ctx, in.Path, bytes.NewReader(data)); err != nil {
		return WriteOutput{}, err
	}
	return WriteOutput{Path: in.Path, Bytes: len(data)}, nil
}

// ListFilesInput is list_files' input.
type ListFilesInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's ID"`
	Path      string `json:"path" jsonschema:"the directory's path"`
	Depth     int    `json:"depth,omitempty" jsonschema:"levels to list, 1 to 10 (default 1)"`
}

// Entry is one entry of list_files' answer.
type Entry struct {
	Path          string `json:"path"`
	Type          string `json:"type" jsonschema:"file, dir or symlink"`
	Size          int64  `json:"size"`
	Permissions   string `json:"permissions"`
	SymlinkTarget string `json:"symlink_target,omitempty"`
}

// ListFilesOutput is list_files' answer.
type ListFilesOutput struct {
	Entries []Entry `json:"entries"`
}

func (t *tools) listFiles(ctx context.Context, _ *sdk.CallToolRequest, in ListFilesInput) (ListFilesOutput, error) {
	if in.Path == "" {
		return ListFilesOutput{}, inputErrorf("path is required")
	}
	if in.Depth < 0 || in.Depth > 10 {
		return ListFilesOutput{}, inputErrorf("depth must be between 1 and 10, got %d", in.Depth)
	}
	e, err := t.envd(ctx, in.SandboxID)
	if err != nil {
		return ListFilesOutput{}, err
	}
	items, err := e.ListDir(ctx, in.Path, in.Depth)
	if err != nil {
		return ListFilesOutput{}, err
	}
	out := ListFilesOutput{Entries: []Entry{}}
	for _, it := range items {
		out.Entries = append(out.Entries, Entry{Path: it.Path, Type: string(it.Type), Size: it.Size,
			Permissions: it.Permissions, SymlinkTarget: it.SymlinkTarget})
	}
	return out, nil
}

// CheckpointInput is checkpoint's input.
type CheckpointInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's ID"`
	Name      string `json:"name,omitempty" jsonschema:"a name for the checkpoint, usable in place of its ID"`
}

func (t *tools) checkpoint(ctx context.Context, _ *sdk.CallToolRequest, in CheckpointInput) (api.Checkpoint, error) {
	if err := checkID(in.SandboxID); err != nil {
		return api.Checkpoint{}, err
	}
	cp, err := t.c.Checkpoint(ctx, in.SandboxID, in.Name)
	if err != nil {
		return api.Checkpoint{}, err
	}
	return *cp, nil
}

// CheckpointsOutput is list_checkpoints' answer.
type CheckpointsOutput struct {
	Checkpoints []api.Checkpoint `json:"checkpoints"`
}

func (t *tools) checkpoints(ctx context.Context, _ *sdk.CallToolRequest, in IDInput) (CheckpointsOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return CheckpointsOutput{}, err
	}
	cps, err := t.c.Checkpoints(ctx, in.SandboxID)
	if err != nil {
		return CheckpointsOutput{}, err
	}
	return CheckpointsOutput{Checkpoints: append([]api.Checkpoint{}, cps...)}, nil
}

// DiffInput is diff's input.
type DiffInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's ID"`
	From      string `json:"from,omitempty" jsonschema:"checkpoint ID or name (default: the sandbox as created)"`
	To        string `json:"to,omitempty" jsonschema:"checkpoint ID or name (default: the sandbox as it is now)"`
}

// DiffOutput is diff's answer.
type DiffOutput struct {
	Changes []api.FileDiff `json:"changes"`
}

func (t *tools) diff(ctx context.Context, _ *sdk.CallToolRequest, in DiffInput) (DiffOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return DiffOutput{}, err
	}
	d, err := t.c.Diff(ctx, in.SandboxID, in.From, in.To)
	if err != nil {
		return DiffOutput{}, err
	}
	return DiffOutput{Changes: append([]api.FileDiff{}, d...)}, nil
}

// RewindInput is rewind's input.
type RewindInput struct {
	SandboxID  string `json:"sandbox_id" jsonschema:"the sandbox's ID"`
	Checkpoint string `json:"checkpoint" jsonschema:"checkpoint ID or name"`
}

// RewindOutput is rewind's answer.
type RewindOutput struct {
	Rewound bool `json:"rewound"`
}

func (t *tools) rewind(ctx context.Context, _ *sdk.CallToolRequest, in RewindInput) (RewindOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return RewindOutput{}, err
	}
	if in.Checkpoint == "" {
		return RewindOutput{}, inputErrorf("checkpoint is required")
	}
	if err := t.c.Rewind(ctx, in.SandboxID, in.Checkpoint); err != nil {
		return RewindOutput{}, err
	}
	return RewindOutput{Rewound: true}, nil
}
