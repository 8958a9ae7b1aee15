package forensics

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// MaxAuditBytes bounds audit.jsonl in an export.
const MaxAuditBytes = 256 << 20

// Bundle is what an export holds.
type Bundle struct {
	Metadata any // metadata.json
	Usage    any // usage.json
	// Audit writes the sandbox's audit records, one line each.
	Audit func(ctx context.Context, w io.Writer) error
	// Layer, if set, writes the layer as an uncompressed tar whose entries
	// are all under changes/. Nil: the export has no changes/ (a note in
	// metadata says why).
	Layer func(ctx context.Context, w io.Writer) error
}

// Write writes b as a tar.gz to w.
func Write(ctx context.Context, w io.Writer, b Bundle) error {
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	now := time.Now().UTC()
	for _, part := range []struct {
		name string
		v    any
	}{{"metadata.json", b.Metadata}, {"usage.json", b.Usage}} {
		data, err := json.MarshalIndent(part.v, "", "  ")
		if err != nil {
			return fmt.Errorf("export: %s: %w", part.name, err)
		}
		data = append(data, '\n')
		if err := writeFile(tw, part.name, data, now); err != nil {
			return err
		}
	}
	if b.Audit != nil {
		if err := writeAudit(ctx, tw, b.Audit, now); err != nil {
			return err
		}
	}
	if b.Layer != nil {
		if err := copyLayer(ctx, tw, b.Layer); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

func writeFile(tw *tar.Writer, name string, data []byte, t time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: t}); err != nil {
		return fmt.Errorf("export: %s: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("export: %s: %w", name, err)
	}
	return nil
}

// capWriter fails writes past n bytes.
type capWriter struct {
	w io.Writer
	n int64
}

var errAuditCap = fmt.Errorf("the sandbox's audit records exceed %d bytes", MaxAuditBytes)

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.n {
		return 0, errAuditCap
	}
	c.n -= int64(len(p))
	return c.w.Write(p)
}

// writeAudit spools the records to an unlinked temporary file (a tar
// entry needs its size first).
func writeAudit(ctx context.Context, tw *tar.Writer, fn func(context.Context, io.Writer) error, t time.Time) error {
	f, err := os.CreateTemp("", "fence-export-audit-*")
	if err != nil {
		return fmt.Errorf("export: audit.jsonl: %w", err)
	}
	os.Remove(f.Name())
	defer f.Close()
	if err := fn(ctx, &capWriter{f, MaxAuditBytes}); err != nil {
		return fmt.Errorf("export: audit.jsonl: %w", err)
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("export: audit.jsonl: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("export: audit.jsonl: %w", err)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "audit.jsonl", Mode: 0o600, Size: size, ModTime: t}); err != nil {
		return fmt.Errorf("export: audit.jsonl: %w", err)
	}
	if _, err := io.CopyN(tw, f, size); err != nil {
		return fmt.Errorf("export: audit.jsonl: %w", err)
	}
	return nil
}

// copyLayer copies the entries of the layer's tar stream into tw,
// refusing any not under changes/.
func copyLayer(ctx context.Context, tw *tar.Writer, fn func(context.Context, io.Writer) error) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(fn(ctx, pw)) }()
	defer pr.Close()
	tr := tar.NewReader(pr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("export: changes: %w", err)
		}
		if !strings.HasPrefix(hdr.Name, "changes/") || strings.Contains(hdr.Name, "/../") || strings.HasSuffix(hdr.Name, "/..") {
			return fmt.Errorf("export: changes: unexpected entry %q", hdr.Name)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("export: changes: %w", err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return fmt.Errorf("export: changes: %w", err)
			}
		}
	}
}
