package fs

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/users"
)

const (
	// maxParts bounds the files of one multipart upload.
	maxParts = 10000
	// maxMetadataKey and maxMetadataTotal are envd's metadata limits.
	maxMetadataKey   = 246
	maxMetadataTotal = 4096
)

// WriteError writes envd's JSON error body {"code":N,"message":"..."}.
func WriteError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Encoding")
	w.Header().Del("Content-Length")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg})
}

func (s *Service) httpUser(w http.ResponseWriter, r *http.Request) (*users.User, bool) {
	u, err := s.users.ByName(r.URL.Query().Get("username"))
	if err != nil {
		WriteError(w, http.StatusUnauthorized, err.Error())
		return nil, false
	}
	return u, true
}

// Download serves GET /files?path=&username=.
func (s *Service) Download(w http.ResponseWriter, r *http.Request) {
	u, ok := s.httpUser(w, r)
	if !ok {
		return
	}
	p := s.users.ResolvePath(r.URL.Query().Get("path"), u)
	var f *os.File
	err := asUser(u, func() (err error) {
		f, err = os.Open(p)
		return err
	})
	if err != nil {
		switch {
		case errors.Is(err, iofs.ErrNotExist), errors.Is(err, unix.ENOTDIR):
			WriteError(w, http.StatusNotFound, fmt.Sprintf("path %s does not exist", p))
		case errors.Is(err, iofs.ErrPermission):
			WriteError(w, http.StatusForbidden, err.Error())
		default:
			WriteError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if fi.IsDir() {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("path %s is a directory", p))
		return
	}
	gz, acceptable := negotiateGzip(r.Header.Values("Accept-Encoding"))
	if !acceptable {
		WriteError(w, http.StatusNotAcceptable, "no acceptable content encoding (identity or gzip)")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": fi.Name()}))
	h.Add("Vary", "Accept-Encoding")
	if gz && fi.Mode().IsRegular() && fi.Size() > 0 {
		h.Set("Content-Encoding", "gzip")
		h.Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		zw := gzip.NewWriter(w)
		if _, err := io.Copy(zw, f); err != nil {
			s.log.Warn("download failed", "path", p, "err", err)
			return
		}
		_ = zw.Close()
		return
	}
	http.ServeContent(w, r, fi.Name(), fi.ModTime(), f)
}

// negotiateGzip reads Accept-Encoding: gzip reports that gzip is wanted,
// acceptable that gzip or identity may be sent.
func negotiateGzip(values []string) (gzip, acceptable bool) {
	identity := true
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			name = strings.ToLower(strings.TrimSpace(name))
			q := 1.0
			if k, val, ok := strings.Cut(strings.TrimSpace(params), "="); ok && strings.TrimSpace(k) == "q" {
				if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
					q = f
				}
			}
			switch name {
			case "gzip":
				gzip = q > 0
			case "identity":
				identity = q > 0
			case "*":
				if q > 0 {
					gzip = true
				} else {
					identity = false
				}
			}
		}
	}
	return gzip, gzip || identity
}

// WriteResult is one element of the POST /files response.
type WriteResult struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

type httpErr struct {
	code int
	msg  string
}

func (e *httpErr) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpErr{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// Upload serves POST /files (multipart/form-data or a raw body with ?path=).
func (s *Service) Upload(w http.ResponseWriter, r *http.Request) {
	res, err := s.upload(r)
	if err != nil {
		var he *httpErr
		switch {
		case errors.As(err, &he):
			WriteError(w, he.code, he.msg)
		case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
			WriteError(w, http.StatusInsufficientStorage, "not enough disk space: "+err.Error())
		case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENAMETOOLONG):
			WriteError(w, http.StatusBadRequest, err.Error())
		case errors.Is(err, iofs.ErrPermission):
			WriteError(w, http.StatusForbidden, err.Error())
		default:
			WriteError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

func (s *Service) upload(r *http.Request) ([]WriteResult, error) {
	u, err := s.users.ByName(r.URL.Query().Get("username"))
	if err != nil {
		return nil, &httpErr{http.StatusUnauthorized, err.Error()}
	}
	md, err := parseMetadata(r.Header)
	if err != nil {
		return nil, err
	}
	body, err := decodedBody(r)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	q := r.URL.Query()
	queryPath, hasPath := q.Get("path"), q.Has("path") && q.Get("path") != ""
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))

	if ct != "multipart/form-data" {
		if !hasPath {
			return nil, badRequest("the path query parameter is required for a %q body", ct)
		}
		res, err := s.writeFile(s.users.ResolvePath(queryPath, u), body, u, md)
		if err != nil {
			return nil, err
		}
		return []WriteResult{res}, nil
	}
	if params["boundary"] == "" {
		return nil, badRequest("multipart body without boundary")
	}
	return s.uploadParts(multipart.NewReader(body, params["boundary"]), queryPath, u, md)
}

// decodedBody is the request's body with its Content-Encoding (none, or
// gzip) taken off.
func decodedBody(r *http.Request) (io.ReadCloser, error) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return io.NopCloser(r.Body), nil
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, badRequest("reading gzip body: %v", err)
		}
		return zr, nil
	default:
		return nil, &httpErr{http.StatusUnsupportedMediaType, fmt.Sprintf("unsupported Content-Encoding %q", enc)}
	}
}

// uploadParts writes each part named "file" of a multipart body as u, to
// queryPath when it is set, else to the part's filename (resolved for u);
// two parts to one path, and more than maxParts files, are refused.
func (s *Service) uploadParts(mr *multipart.Reader, queryPath string, u *users.User, md map[string]string) ([]WriteResult, error) {
	seen := map[string]bool{}
	var out []WriteResult
	for {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, badRequest("reading multipart body: %v", err)
		}
		disp, dparams, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		if disp != "form-data" || dparams["name"] != "file" {
			part.Close()
			continue
		}
		if len(out) >= maxParts {
			return nil, badRequest("too many files in one request (max %d)", maxParts)
		}
		name := dparams["filename"] // raw: Part.FileName() would strip directories
		if queryPath != "" {
			name = queryPath
		}
		if name == "" {
			return nil, badRequest("file part without a filename and no path query parameter")
		}
		dest := s.users.ResolvePath(name, u)
		if seen[dest] {
			return nil, badRequest("duplicate path %s in one request", dest)
		}
		seen[dest] = true
		var src io.Reader = part
		if strings.EqualFold(part.Header.Get("Content-Transfer-Encoding"), "quoted-printable") {
			return nil, badRequest("quoted-printable parts are not supported")
		}
		res, err := s.writeFile(dest, src, u, md)
		part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	if len(out) == 0 {
		return nil, badRequest("no file part named \"file\" in the request")
	}
	return out, nil
}

// writeFile streams src into path as u (see asUser): parents are created
// and owned by u, an existing file is truncated and keeps its owner, a new
// one is u's with mode 0644; its user.e2b.* metadata is replaced by md.
func (s *Service) writeFile(path string, src io.Reader, u *users.User, md map[string]string) (WriteResult, error) {
	f, err := openForUpload(path, u)
	if err != nil {
		return WriteResult{}, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	if _, err := io.CopyBuffer(f, src, buf); err != nil {
		return WriteResult{}, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := replaceMetadata(f, md); err != nil {
		return WriteResult{}, fmt.Errorf("setting metadata of %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return WriteResult{}, fmt.Errorf("closing %s: %w", path, err)
	}
	res := WriteResult{Path: path, Name: filepath.Base(path), Type: "file"}
	if len(md) > 0 {
		res.Metadata = md
	}
	return res, nil
}

// openForUpload opens path for writing with u's credentials, creating its
// parents.
func openForUpload(path string, u *users.User) (*os.File, error) {
	var f *os.File
	err := asUser(u, func() error {
		existed := false
		if fi, err := os.Stat(path); err == nil {
			if fi.IsDir() {
				return badRequest("path %s is a directory", path)
			}
			existed = true
		}
		if err := ensureDir(filepath.Dir(path), u); err != nil {
			if errors.Is(err, unix.ENOTDIR) {
				return badRequest("creating parent of %s: %v", path, err)
			}
			return fmt.Errorf("creating parent of %s: %w", path, err)
		}
		var err error
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("opening %s: %w", path, err)
		}
		if !existed {
			if err := f.Chown(int(u.UID), int(u.GID)); err != nil {
				f.Close()
				return fmt.Errorf("chowning %s: %w", path, err)
			}
			if err := f.Chmod(0o644); err != nil {
				f.Close()
				return fmt.Errorf("chmoding %s: %w", path, err)
			}
		}
		return nil
	})
	return f, err
}

// parseMetadata collects X-Metadata-<Key> headers: keys lowercased, keys
// and values printable ASCII, within envd's size limits.
func parseMetadata(h http.Header) (map[string]string, error) {
	const prefix = "x-metadata-"
	var md map[string]string
	total := 0
	for k, vs := range h {
		lk := strings.ToLower(k)
		if !strings.HasPrefix(lk, prefix) || len(vs) == 0 {
			continue
		}
		key, val := lk[len(prefix):], vs[0]
		if key == "" || !printable(key) || !printable(val) {
			return nil, badRequest("metadata %q: keys and values must be printable ASCII", key)
		}
		if len(key) > maxMetadataKey {
			return nil, badRequest("metadata key %q is longer than %d bytes", key, maxMetadataKey)
		}
		total += len(key) + len(val)
		if total > maxMetadataTotal {
			return nil, badRequest("metadata is larger than %d bytes", maxMetadataTotal)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = val
	}
	return md, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// replaceMetadata removes f's user.e2b.* xattrs and sets md.
func replaceMetadata(f *os.File, md map[string]string) error {
	fd := int(f.Fd())
	keys, err := listXattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil && len(md) > 0 {
		return err
	}
	for _, k := range keys {
		if strings.HasPrefix(k, xattrPrefix) {
			if err := unix.Fremovexattr(fd, k); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, xattrPrefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}
