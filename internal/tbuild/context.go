package tbuild

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ContextArchive writes to w the gzipped tar of what the COPY of src
// (relative to the build context dir, globs allowed) takes, and returns
// the step's files hash: a sha256 over "COPY src dest" and each entry's
// relative path, mode, size and content (a symlink's target), in path
// order. Symlinks are archived as links, never followed; a source outside
// the context is an error.
func ContextArchive(dir, src, dest string, w io.Writer) (string, error) {
	if path.IsAbs(src) || slices.Contains(strings.Split(path.Clean(filepath.ToSlash(src)), "/"), "..") {
		return "", fmt.Errorf("COPY %s: the source must be a relative path inside the build context", src)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return "", fmt.Errorf("opening the build context: %w", err)
	}
	defer root.Close()
	entries, err := contextEntries(root, dir, src)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "COPY %s %s", src, dest)
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	for _, p := range entries {
		if err := archiveEntry(root, tw, h, src, p); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// contextEntries lists, sorted, the paths the COPY of src takes from the
// build context: each match of its glob and everything under it.
func contextEntries(root *os.Root, dir, src string) ([]string, error) {
	matches, err := fs.Glob(root.FS(), path.Clean(filepath.ToSlash(src)))
	if err != nil {
		return nil, fmt.Errorf("COPY %s: %w", src, err)
	}
	if len(matches) == 0 {
		return nil, fmt.Errorf("COPY %s: no files found in the build context %s", src, dir)
	}
	seen := map[string]bool{}
	var entries []string
	for _, m := range matches {
		err := fs.WalkDir(root.FS(), m, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !seen[p] {
				seen[p] = true
				entries = append(entries, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("COPY %s: %w", src, err)
		}
	}
	slices.Sort(entries)
	return entries, nil
}

// archiveEntry writes the context's entry p to tw and hashes it into h:
// its path and mode, then a symlink's target or a file's size and
// content.
func archiveEntry(root *os.Root, tw *tar.Writer, h hash.Hash, src, p string) error {
	fi, err := root.Lstat(p)
	if err != nil {
		return err
	}
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return fmt.Errorf("COPY %s: %s: %w", src, p, err)
	}
	hdr.Name = p
	hdr.Uname, hdr.Gname = "", ""
	h.Write([]byte(p + strconv.FormatUint(uint64(fi.Mode()), 10)))
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := root.Readlink(p)
		if err != nil {
			return err
		}
		hdr.Linkname = t
		h.Write([]byte(t))
		return tw.WriteHeader(hdr)
	case fi.IsDir():
		hdr.Name += "/"
		return tw.WriteHeader(hdr)
	case fi.Mode().IsRegular():
		h.Write([]byte(strconv.FormatInt(fi.Size(), 10)))
		f, err := root.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = io.Copy(io.MultiWriter(tw, h), io.LimitReader(f, fi.Size()))
		return err
	}
	return fmt.Errorf("COPY %s: %s is not a file, directory or symlink", src, p)
}
