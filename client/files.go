package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"time"

	"github.com/fencesandbox/fence/api/envd/filesystem"
)

// FileType is the type of a filesystem entry.
type FileType string

// File types. A symlink is reported with its target's type and a
// SymlinkTarget.
const (
	TypeFile    FileType = "file"
	TypeDir     FileType = "dir"
	TypeSymlink FileType = "symlink"
	TypeUnknown FileType = ""
)

// EntryInfo describes a file or directory in a sandbox.
type EntryInfo struct {
	Name          string      // base name
	Path          string      // absolute path
	Type          FileType    // of the entry, or of a symlink's target
	Size          int64       // bytes
	Mode          fs.FileMode // permission bits
	Permissions   string      // e.g. "-rw-r--r--"
	Owner, Group  string      // names
	ModTime       time.Time   // last modification
	SymlinkTarget string      // resolved target of a symlink, else ""
	Metadata      map[string]string
}

func entryInfo(e *filesystem.EntryInfo) EntryInfo {
	info := EntryInfo{
		Name:          e.GetName(),
		Path:          e.GetPath(),
		Size:          e.GetSize(),
		Mode:          fs.FileMode(e.GetMode()),
		Permissions:   e.GetPermissions(),
		Owner:         e.GetOwner(),
		Group:         e.GetGroup(),
		SymlinkTarget: e.GetSymlinkTarget(),
		Metadata:      e.GetMetadata(),
	}
	if t := e.GetModifiedTime(); t != nil {
		info.ModTime = t.AsTime()
	}
	switch e.GetType() {
	case filesystem.FileType_FILE_TYPE_FILE:
		info.Type = TypeFile
	case filesystem.FileType_FILE_TYPE_DIRECTORY:
		info.Type = TypeDir
	case filesystem.FileType_FILE_TYPE_SYMLINK:
		info.Type = TypeSymlink
	}
	return info
}

// filesURL is the /files URL for path, with the user selection.
func (e *Envd) filesURL(path string) string {
	q := url.Values{"path": {path}}
	if e.user != "" {
		q.Set("username", e.user)
	}
	return e.baseURL + "/files?" + q.Encode()
}

// ReadFile opens a file in the sandbox for reading (GET /files). The caller
// closes the returned reader. Relative paths are taken from the user's home.
func (e *Envd) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.filesURL(path), nil)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	e.setHeaders(req.Header, "")
	req.Header.Del("Authorization") // /files selects the user by query
	resp, err := e.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("reading %s: %w", path, decodeError(resp))
	}
	return resp.Body, nil
}

// WriteFile writes r to a file in the sandbox (POST /files as
// application/octet-stream), creating missing parent directories and
// truncating an existing file.
func (e *Envd) WriteFile(ctx context.Context, path string, r io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.filesURL(path), r)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	e.setHeaders(req.Header, "")
	req.Header.Del("Authorization")
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := e.hc.Do(req)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("writing %s: %w", path, decodeError(resp))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	return nil
}

// Stat describes the entry at path. A missing path is api.ErrNotFound.
func (e *Envd) Stat(ctx context.Context, path string) (EntryInfo, error) {
	resp, err := e.fs.Stat(ctx, request(e, &filesystem.StatRequest{Path: path}, ""))
	if err != nil {
		return EntryInfo{}, wrapRPC("stat "+path, err)
	}
	return entryInfo(resp.Msg.GetEntry()), nil
}

// ListDir lists the entries under the directory path, down to depth levels
// (depth below 1 means 1).
func (e *Envd) ListDir(ctx context.Context, path string, depth int) ([]EntryInfo, error) {
	if depth < 1 {
		depth = 1
	}
	resp, err := e.fs.ListDir(ctx, request(e, &filesystem.ListDirRequest{Path: path, Depth: uint32(depth)}, ""))
	if err != nil {
		return nil, wrapRPC("listing "+path, err)
	}
	var out []EntryInfo
	for _, en := range resp.Msg.GetEntries() {
		out = append(out, entryInfo(en))
	}
	return out, nil
}

// MakeDir creates a directory and its missing parents. An existing
// directory is api.ErrConflict.
func (e *Envd) MakeDir(ctx context.Context, path string) (EntryInfo, error) {
	resp, err := e.fs.MakeDir(ctx, request(e, &filesystem.MakeDirRequest{Path: path}, ""))
	if err != nil {
		return EntryInfo{}, wrapRPC("making directory "+path, err)
	}
	return entryInfo(resp.Msg.GetEntry()), nil
}

// Remove removes path recursively. Removing a missing path succeeds.
func (e *Envd) Remove(ctx context.Context, path string) error {
	_, err := e.fs.Remove(ctx, request(e, &filesystem.RemoveRequest{Path: path}, ""))
	return wrapRPC("removing "+path, err)
}

// Move renames src to dst and describes dst.
func (e *Envd) Move(ctx context.Context, src, dst string) (EntryInfo, error) {
	resp, err := e.fs.Move(ctx, request(e, &filesystem.MoveRequest{Source: src, Destination: dst}, ""))
	if err != nil {
		return EntryInfo{}, wrapRPC(fmt.Sprintf("moving %s to %s", src, dst), err)
	}
	return entryInfo(resp.Msg.GetEntry()), nil
}
