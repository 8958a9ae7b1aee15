package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"time"

	"github.com/pkg/sftp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// agentFS is the sftp handlers over a sandbox's agent: reads and writes
// go through a host temporary file (an SFTP client reads and writes at
// offsets, the agent's /files streams whole files), bounded by max.
type agentFS struct {
	ctx context.Context
	c   *conn
	e   *client.Envd
	max int64
	dir string
}

// errTooLarge is the answer for a file over the spool bound.
var errTooLarge = errors.New("file larger than the SSH server's transfer limit")

func (a *agentFS) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	rc, err := a.e.ReadFile(a.ctx, r.Filepath)
	if err != nil {
		return nil, mapErr(err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(a.dir, "fence-sftp-*")
	if err != nil {
		return nil, err
	}
	_ = os.Remove(f.Name()) // unlinked: gone with the last close, also after a crash
	n, err := io.Copy(f, io.LimitReader(rc, a.max+1))
	if err == nil && n > a.max {
		err = errTooLarge
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	a.c.event(a.ctx, TypeSFTP, map[string]any{"op": "read", "path": r.Filepath, "bytes": n})
	return f, nil
}

// spoolWriter collects an upload and writes it to the sandbox on Close.
type spoolWriter struct {
	a    *agentFS
	path string
	f    *os.File
	mu   sync.Mutex
	err  error
}

func (w *spoolWriter) WriteAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > w.a.max {
		return 0, errTooLarge
	}
	return w.f.WriteAt(p, off)
}

func (w *spoolWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return w.err
	}
	defer func() { w.f.Close(); w.f = nil }()
	size, err := w.f.Seek(0, io.SeekEnd)
	if err == nil {
		_, err = w.f.Seek(0, io.SeekStart)
	}
	if err == nil {
		err = w.a.e.WriteFile(w.a.ctx, w.path, w.f)
	}
	data := map[string]any{"op": "write", "path": w.path, "bytes": size}
	if err != nil {
		data["error"] = err.Error()
		w.err = mapErr(err)
	}
	w.a.c.event(w.a.ctx, TypeSFTP, data)
	return w.err
}

func (a *agentFS) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	f, err := os.CreateTemp(a.dir, "fence-sftp-*")
	if err != nil {
		return nil, err
	}
	_ = os.Remove(f.Name())
	return &spoolWriter{a: a, path: r.Filepath, f: f}, nil
}

func (a *agentFS) Filecmd(r *sftp.Request) error {
	var err error
	switch r.Method {
	case "Mkdir":
		_, err = a.e.MakeDir(a.ctx, r.Filepath)
	case "Remove", "Rmdir":
		err = a.e.Remove(a.ctx, r.Filepath)
	case "Rename", "PosixRename":
		_, err = a.e.Move(a.ctx, r.Filepath, r.Target)
	case "Setstat":
		return nil // modes and times stay the agent's
	default:
		return sftp.ErrSSHFxOpUnsupported
	}
	if err == nil {
		a.c.event(a.ctx, TypeSFTP, map[string]any{"op": r.Method, "path": r.Filepath, "target": r.Target})
	}
	return mapErr(err)
}

func (a *agentFS) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	switch r.Method {
	case "List":
		entries, err := a.e.ListDir(a.ctx, r.Filepath, 1)
		if err != nil {
			return nil, mapErr(err)
		}
		l := make(lister, len(entries))
		for i, e := range entries {
			l[i] = fileInfo{e}
		}
		return l, nil
	case "Stat", "Lstat":
		e, err := a.e.Stat(a.ctx, r.Filepath)
		if err != nil {
			return nil, mapErr(err)
		}
		return lister{fileInfo{e}}, nil
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

// mapErr turns the agent's errors into the ones sftp reports by code.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, api.ErrNotFound):
		return os.ErrNotExist
	case errors.Is(err, api.ErrPermissionDenied):
		return os.ErrPermission
	}
	return fmt.Errorf("%w", err)
}

type lister []os.FileInfo

func (l lister) ListAt(out []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(out, l[off:])
	if off+int64(n) >= int64(len(l)) {
		return n, io.EOF
	}
	return n, nil
}

// fileInfo is an agent's entry as an os.FileInfo.
type fileInfo struct{ e client.EntryInfo }

func (f fileInfo) Name() string {
	if f.e.Name != "" {
		return f.e.Name
	}
	return path.Base(f.e.Path)
}
func (f fileInfo) Size() int64 { return f.e.Size }
func (f fileInfo) Mode() fs.FileMode {
	m := f.e.Mode.Perm()
	switch f.e.Type {
	case client.TypeDir:
		m |= fs.ModeDir
	case client.TypeSymlink:
		m |= fs.ModeSymlink
	}
	return m
}
func (f fileInfo) ModTime() time.Time { return f.e.ModTime }
func (f fileInfo) IsDir() bool        { return f.e.Type == client.TypeDir }
func (f fileInfo) Sys() any           { return nil }
