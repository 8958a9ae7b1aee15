package tbuild

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/fencesandbox/fence/api"
)

// maxArchiveEntries bounds the entries of one COPY archive.
const maxArchiveEntries = 200000

// storeArchive checks an uploaded COPY archive (a tar, gzipped or not:
// the gzip magic decides) and keeps it, uncompressed, as dir/hash.tar.
// A malformed archive keeps nothing.
func storeArchive(ctx context.Context, dir, hash string, body io.Reader, limit int64) (err error) {
	br := bufio.NewReader(io.LimitReader(body, limit+1))
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("upload is not a valid gzip stream: %v: %w", err, api.ErrInvalidArgument)
		}
		defer zr.Close()
		r = zr
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+hash+"-")
	if err != nil {
		return fmt.Errorf("keeping upload: %w", err)
	}
	defer func() {
		tmp.Close()
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	counted := &countWriter{w: tmp, limit: limit}
	tr := tar.NewReader(io.TeeReader(r, counted))
	n := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, errTooLarge) || errors.Is(err, io.ErrUnexpectedEOF) && counted.n > limit {
			return fmt.Errorf("upload is larger than %d bytes: %w", limit, api.ErrInvalidArgument)
		}
		if err != nil {
			return fmt.Errorf("upload is not a valid tar archive: %v: %w", err, api.ErrInvalidArgument)
		}
		n++
		if n > maxArchiveEntries {
			return fmt.Errorf("upload has more than %d entries: %w", maxArchiveEntries, api.ErrInvalidArgument)
		}
		if err := checkEntry(hdr); err != nil {
			return err
		}
	}
	// Whatever follows the end-of-archive marker is kept too.
	if _, err := io.Copy(io.Discard, io.TeeReader(r, counted)); err != nil {
		if errors.Is(err, errTooLarge) {
			return fmt.Errorf("upload is larger than %d bytes: %w", limit, api.ErrInvalidArgument)
		}
		return fmt.Errorf("reading upload: %v: %w", err, api.ErrInvalidArgument)
	}
	if n == 0 {
		return fmt.Errorf("upload is an empty tar archive: %w", api.ErrInvalidArgument)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("keeping upload: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, hash+".tar")); err != nil {
		return fmt.Errorf("keeping upload: %w", err)
	}
	return nil
}

// checkEntry refuses entries that are not relative paths inside the
// archive, and kinds a COPY never carries.
func checkEntry(hdr *tar.Header) error {
	name := hdr.Name
	bad := func(why string) error {
		return fmt.Errorf("upload entry %q: %s: %w", name, why, api.ErrInvalidArgument)
	}
	if name == "" || strings.HasPrefix(name, "/") || strings.ContainsRune(name, 0) {
		return bad("not a relative path")
	}
	for _, part := range strings.Split(path.Clean(name), "/") {
		if part == ".." {
			return bad("leaves the archive (..)")
		}
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeXGlobalHeader:
	default:
		return bad(fmt.Sprintf("unsupported entry type %q", hdr.Typeflag))
	}
	if hdr.Typeflag == tar.TypeLink {
		for _, part := range strings.Split(path.Clean(hdr.Linkname), "/") {
			if part == ".." || strings.HasPrefix(hdr.Linkname, "/") {
				return bad("hard link leaves the archive")
			}
		}
	}
	return nil
}

var errTooLarge = errors.New("too large")

type countWriter struct {
	w     io.Writer
	n     int64
	limit int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	if c.n > c.limit {
		return 0, errTooLarge
	}
	return c.w.Write(p)
}
