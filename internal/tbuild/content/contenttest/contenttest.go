// Package contenttest makes COPY archives for the tests of the content
// store and of its users.
package contenttest

import (
	"archive/tar"
	"bytes"
	"testing"
	"time"
)

// TarFiles is a tar of a directory app/ and regular files (name, content,
// name, content, …), entries in the order given, with mtime mtime.
func TarFiles(t testing.TB, mtime time.Time, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime})
	for i := 0; i+1 < len(files); i += 2 {
		tw.WriteHeader(&tar.Header{Name: files[i], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[i+1])), ModTime: mtime, Uid: i})
		tw.Write([]byte(files[i+1]))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
