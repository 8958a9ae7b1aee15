package fs

import (
	"errors"
	iofs "io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/fencesandbox/fence/api/envd/filesystem"
)

const xattrPrefix = "user.e2b."

// names caches uid/gid → name lookups for one request.
type names struct {
	users  map[uint32]string
	groups map[uint32]string
}

func newNames() *names {
	return &names{users: map[uint32]string{}, groups: map[uint32]string{}}
}

func (n *names) user(id uint32) string {
	if s, ok := n.users[id]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(id), 10)
	if u, err := user.LookupId(s); err == nil {
		s = u.Username
	}
	n.users[id] = s
	return s
}

func (n *names) group(id uint32) string {
	if s, ok := n.groups[id]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(id), 10)
	if g, err := user.LookupGroupId(s); err == nil {
		s = g.Name
	}
	n.groups[id] = s
	return s
}

func fileType(m os.FileMode) pb.FileType {
	switch {
	case m.IsRegular():
		return pb.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return pb.FileType_FILE_TYPE_DIRECTORY
	case m&os.ModeSymlink != 0:
		return pb.FileType_FILE_TYPE_SYMLINK
	}
	return pb.FileType_FILE_TYPE_UNSPECIFIED
}

// entryInfo describes path as envd does: a symlink reports its target's
// type and permission bits, with the absolute resolved target in
// SymlinkTarget; the rest (size, permissions string, owner, time) is the
// entry's own.
func entryInfo(path string, n *names) (*pb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	mode := fi.Mode()
	e := &pb.EntryInfo{
		Name:         filepath.Base(path),
		Path:         path,
		Size:         fi.Size(),
		Permissions:  mode.String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Type:         fileType(mode),
		Mode:         uint32(mode.Perm()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = n.user(st.Uid)
		e.Group = n.group(st.Gid)
	}
	if mode&os.ModeSymlink != 0 {
		if target, err := filepath.EvalSymlinks(path); err == nil {
			if abs, err := filepath.Abs(target); err == nil {
				target = abs
			}
			e.SymlinkTarget = &target
			if tfi, err := os.Stat(target); err == nil {
				e.Type = fileType(tfi.Mode())
				e.Mode = uint32(tfi.Mode().Perm())
			}
		} else if t, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(t) {
				t = filepath.Join(filepath.Dir(path), t)
			}
			t = filepath.Clean(t)
			e.SymlinkTarget = &t
		}
	}
	if md := readMetadata(path); len(md) > 0 {
		e.Metadata = md
	}
	return e, nil
}

// readMetadata returns the user.e2b.* xattrs of path (following symlinks),
// prefix stripped.
func readMetadata(path string) map[string]string {
	keys, err := listXattrs(func(b []byte) (int, error) { return unix.Listxattr(path, b) })
	if err != nil {
		return nil
	}
	var md map[string]string
	for _, k := range keys {
		if !strings.HasPrefix(k, xattrPrefix) {
			continue
		}
		v, err := getXattr(path, k)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.TrimPrefix(k, xattrPrefix)] = v
	}
	return md
}

func listXattrs(list func([]byte) (int, error)) ([]string, error) {
	size, err := list(nil)
	if err != nil || size == 0 {
		return nil, err
	}
	buf := make([]byte, size+256)
	size, err = list(buf)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, k := range strings.Split(string(buf[:size]), "\x00") {
		if k != "" {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

func getXattr(path, key string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Getxattr(path, key, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// rpcError maps a file operation error to a Connect error.
func rpcError(err error) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, iofs.ErrNotExist), errors.Is(err, unix.ENOTDIR):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, iofs.ErrExist):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, iofs.ErrPermission):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.ELOOP):
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}
