package content

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fencesandbox/fence/api"
)

// maxArchiveEntries bounds the entries of one COPY archive.
const maxArchiveEntries = 200000

// storeArchive checks an uploaded COPY archive (a tar, gzipped or not:
// the gzip magic decides) and keeps it, uncompressed, as dir/hash.tar,
// returning its files digest (FilesDigest). An archive is written once: if
// dir/hash.tar exists, the upload is accepted only when it holds the same
// files (the same files digest), and the kept archive stays as it is. A
// malformed archive, or other files under a kept hash, keeps nothing.
func storeArchive(ctx context.Context, dir, hash string, body io.Reader, limit int64) (digest string, created bool, err error) {
	br := bufio.NewReader(io.LimitReader(body, limit+1))
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return "", false, fmt.Errorf("upload is not a valid gzip stream: %v: %w", err, api.ErrInvalidArgument)
		}
		defer zr.Close()
		r = zr
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+hash+"-")
	if err != nil {
		return "", false, fmt.Errorf("keeping upload: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name()) // after a link to hash.tar, that name stays
	}()
	counted := &countWriter{w: tmp, limit: limit}
	in := io.TeeReader(r, counted)
	digest, err = FilesDigest(ctx, in, true)
	if errors.Is(err, errTooLarge) || errors.Is(err, io.ErrUnexpectedEOF) && counted.n > limit {
		return "", false, fmt.Errorf("upload is larger than %d bytes: %w", limit, api.ErrInvalidArgument)
	}
	if err != nil {
		return "", false, err
	}
	// Whatever follows the end-of-archive marker is kept too.
	if _, err := io.Copy(io.Discard, in); err != nil {
		if errors.Is(err, errTooLarge) {
			return "", false, fmt.Errorf("upload is larger than %d bytes: %w", limit, api.ErrInvalidArgument)
		}
		return "", false, fmt.Errorf("reading upload: %v: %w", err, api.ErrInvalidArgument)
	}
	if err := tmp.Sync(); err != nil {
		return "", false, fmt.Errorf("keeping upload: %w", err)
	}
	final := filepath.Join(dir, hash+".tar")
	err = os.Link(tmp.Name(), final) // never replaces a kept archive
	if errors.Is(err, fs.ErrExist) {
		kept, kerr := storedDigest(ctx, final)
		if kerr != nil {
			return "", false, fmt.Errorf("reading the kept archive of files hash %s: %w", hash, kerr)
		}
		if kept != digest {
			return "", false, fmt.Errorf("upload holds other files than those kept under files hash %s (one files hash names one set of files): %w", hash, api.ErrConflict)
		}
		return digest, false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("keeping upload: %w", err)
	}
	return digest, true, nil
}

// storedDigest is the files digest of a kept archive.
func storedDigest(ctx context.Context, name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return FilesDigest(ctx, bufio.NewReaderSize(f, 256<<10), false)
}

// FilesDigest reads a tar stream to its end-of-archive marker and returns
// the digest of the files it holds: sha256 over its entries sorted by
// name, each one its name, type, permission bits, link target, size and
// content. Owners, times and extended attributes are left out: two
// archives of the same files made at different times have one digest.
// With check set, the entries are checked (checkEntry) and counted.
func FilesDigest(ctx context.Context, r io.Reader, check bool) (string, error) {
	type entry struct {
		name string
		sum  [sha256.Size]byte
	}
	var entries []entry
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, errTooLarge) {
			return "", err
		}
		if err != nil {
			return "", fmt.Errorf("upload is not a valid tar archive: %w: %w", err, api.ErrInvalidArgument)
		}
		if check {
			if len(entries) >= maxArchiveEntries {
				return "", fmt.Errorf("upload has more than %d entries: %w", maxArchiveEntries, api.ErrInvalidArgument)
			}
			if err := checkEntry(hdr); err != nil {
				return "", err
			}
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name := path.Clean(hdr.Name)
		h := sha256.New()
		for _, part := range []string{name, string(hdr.Typeflag), strconv.FormatInt(hdr.Mode&0o7777, 8), hdr.Linkname, strconv.FormatInt(hdr.Size, 10)} {
			fmt.Fprintf(h, "%d:%s", len(part), part)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.Copy(h, tr); err != nil {
				if errors.Is(err, errTooLarge) {
					return "", err
				}
				return "", fmt.Errorf("upload is not a valid tar archive: %w: %w", err, api.ErrInvalidArgument)
			}
		}
		e := entry{name: name}
		h.Sum(e.sum[:0])
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return "", fmt.Errorf("upload is an empty tar archive: %w", api.ErrInvalidArgument)
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return bytes.Compare(a.sum[:], b.sum[:])
	})
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%d:%s", len(e.name), e.name)
		h.Write(e.sum[:])
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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
