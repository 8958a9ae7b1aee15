// Package fs implements envd's filesystem.Filesystem Connect service and
// the /files upload and download routes.
//
// File operations run with the request's user's filesystem credentials
// (fsuid, fsgid and groups, on a thread of their own): the kernel checks
// permissions and follows symlinks as that user would, so a symlink a user
// plants cannot make the agent read or write what the user could not.
// Whatever they create (files, parent directories) is owned by the user.
// As envd does, missing parent directories are created even where the
// user may not create them (a new top-level directory), and handed to the
// user: those alone are made with the agent's credentials, through
// descriptors that follow no symlink, in directories the user may search
// but not change (ensureDir). Paths are resolved as envd does
// (users.ResolvePath).
// Uploads are streamed to disk, never held in memory. Watchers keep a
// bounded event queue each.
package fs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	iofs "io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	pb "github.com/fencesandbox/fence/api/envd/filesystem"
	"github.com/fencesandbox/fence/api/envd/filesystem/filesystemconnect"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// maxWatchers bounds the polling watchers (CreateWatcher) alive at once,
// and the WatchDir streams open at once.
const maxWatchers = 256

// Options configures a Service.
type Options struct {
	Users  *users.Resolver // required
	Logger *slog.Logger    // nil = discard
}

// Service is the filesystem.Filesystem handler and the /files handler.
type Service struct {
	users *users.Resolver
	log   *slog.Logger

	queued  atomic.Int64 // watch events queued by all watchers
	streams atomic.Int64 // WatchDir streams open

	mu       sync.Mutex
	watchers map[string]*watch
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// NewService returns a Service; Close stops its watchers.
func NewService(opts Options) *Service {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{users: opts.Users, log: opts.Logger, watchers: map[string]*watch{}}
}

// Handler returns the Connect route prefix and handler.
func (s *Service) Handler(opts ...connect.HandlerOption) (string, http.Handler) {
	return filesystemconnect.NewFilesystemHandler(s, opts...)
}

// Close removes every polling watcher.
func (s *Service) Close() {
	s.mu.Lock()
	ws := s.watchers
	s.watchers = map[string]*watch{}
	s.mu.Unlock()
	for _, w := range ws {
		w.close()
	}
}

func (s *Service) user(h http.Header) (*users.User, error) {
	u, err := s.users.FromHeader(h)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return u, nil
}

// Stat describes one path.
func (s *Service) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	u, err := s.user(req.Header())
	if err != nil {
		return nil, err
	}
	var e *pb.EntryInfo
	err = asUser(u, func() (err error) {
		e, err = entryInfo(s.users.ResolvePath(req.Msg.GetPath(), u), newNames())
		return err
	})
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its parents, owned by the user.
func (s *Service) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	u, err := s.user(req.Header())
	if err != nil {
		return nil, err
	}
	return runAs(u, func() (*connect.Response[pb.MakeDirResponse], error) {
		p := s.users.ResolvePath(req.Msg.GetPath(), u)
		if fi, err := os.Stat(p); err == nil {
			if fi.IsDir() {
				return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
			}
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s exists and is not a directory", p))
		}
		if err := ensureDir(p, u); err != nil {
			if errors.Is(err, errNotDir) {
				return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("creating directory %s: %w", p, err))
			}
			return nil, rpcError(fmt.Errorf("creating directory %s: %w", p, err))
		}
		e, err := entryInfo(p, newNames())
		if err != nil {
			return nil, rpcError(err)
		}
		return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
	})
}

// Move renames source to destination, creating the destination's parents.
func (s *Service) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	u, err := s.user(req.Header())
	if err != nil {
		return nil, err
	}
	return runAs(u, func() (*connect.Response[pb.MoveResponse], error) {
		src := s.users.ResolvePath(req.Msg.GetSource(), u)
		dst := s.users.ResolvePath(req.Msg.GetDestination(), u)
		if _, err := os.Lstat(src); err != nil {
			return nil, rpcError(err)
		}
		if err := ensureDir(filepath.Dir(dst), u); err != nil {
			if errors.Is(err, errNotDir) {
				return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("creating parent of %s: %w", dst, err))
			}
			return nil, rpcError(fmt.Errorf("creating parent of %s: %w", dst, err))
		}
		err = os.Rename(src, dst)
		if errors.Is(err, unix.EXDEV) {
			// overlayfs refuses to rename directories from a lower layer (and
			// mounts are separate filesystems): copy, then remove, like mv.
			err = moveByCopy(src, dst)
		}
		if err != nil {
			if errors.Is(err, iofs.ErrExist) || errors.Is(err, errNotEmpty) || errors.Is(err, errIsDir) || errors.Is(err, errNotDir) {
				return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("moving %s to %s: %w", src, dst, err))
			}
			return nil, rpcError(fmt.Errorf("moving %s to %s: %w", src, dst, err))
		}
		e, err := entryInfo(dst, newNames())
		if err != nil {
			return nil, rpcError(err)
		}
		return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
	})
}

// ListDir lists a directory down to the requested depth (0 means 1).
func (s *Service) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	u, err := s.user(req.Header())
	if err != nil {
		return nil, err
	}
	return runAs(u, func() (*connect.Response[pb.ListDirResponse], error) {
		root := s.users.ResolvePath(req.Msg.GetPath(), u)
		fi, err := os.Stat(root)
		if err != nil {
			return nil, rpcError(err)
		}
		if !fi.IsDir() {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
		}
		depth := int(req.Msg.GetDepth())
		if depth < 1 {
			depth = 1
		}
		n := newNames()
		res := &pb.ListDirResponse{}
		var walk func(dir string, level int) error
		walk = func(dir string, level int) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			des, err := os.ReadDir(dir)
			if err != nil {
				if level == 1 {
					return err
				}
				return nil // unreadable subdirectory: list what we can
			}
			for _, de := range des {
				p := filepath.Join(dir, de.Name())
				e, err := entryInfo(p, n)
				if err != nil {
					continue // vanished meanwhile
				}
				res.Entries = append(res.Entries, e)
				if level < depth && de.IsDir() {
					if err := walk(p, level+1); err != nil {
						return err
					}
				}
			}
			return nil
		}
		if err := walk(root, 1); err != nil {
			return nil, rpcError(err)
		}
		return connect.NewResponse(res), nil
	})
}

// Remove removes a path recursively; a missing path is not an error.
func (s *Service) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	u, err := s.user(req.Header())
	if err != nil {
		return nil, err
	}
	return runAs(u, func() (*connect.Response[pb.RemoveResponse], error) {
		p := s.users.ResolvePath(req.Msg.GetPath(), u)
		if p == "/" {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
		}
		if err := os.RemoveAll(p); err != nil {
			return nil, rpcError(fmt.Errorf("removing %s: %w", p, err))
		}
		return connect.NewResponse(&pb.RemoveResponse{}), nil
	})
}

// CreateWatcher starts a polling watcher (used by the Python sync SDK).
func (s *Service) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	u, err := s.user(req.Header())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	n := len(s.watchers)
	s.mu.Unlock()
	if n >= maxWatchers {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("too many watchers (%d)", n))
	}
	m := req.Msg
	w, err := runAs(u, func() (*watch, error) {
		return newWatch(s.users.ResolvePath(m.GetPath(), u), m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts(), &s.queued, s.log)
	})
	if err != nil {
		return nil, err
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	s.mu.Lock()
	s.watchers[id] = w
	s.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents returns and clears a watcher's queued events.
func (s *Service) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	s.mu.Lock()
	w := s.watchers[req.Msg.GetWatcherId()]
	s.mu.Unlock()
	if w == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	evs, overflow := w.take()
	if overflow {
		s.mu.Lock()
		delete(s.watchers, req.Msg.GetWatcherId())
		s.mu.Unlock()
		w.close()
		return nil, errWatchOverflow
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: evs}), nil
}

// RemoveWatcher stops a watcher.
func (s *Service) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	s.mu.Lock()
	w := s.watchers[req.Msg.GetWatcherId()]
	delete(s.watchers, req.Msg.GetWatcherId())
	s.mu.Unlock()
	if w == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	w.close()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
