package template

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	. "github.com/fencesandbox/fence/internal/oci/ocitest"
)

// BenchmarkImageTemplates (report only; run with -bench ImageTemplates
// -benchtime 1x and FENCE_TEST_TEMPLATES naming a built base template)
// pushes base's tree as a one-layer image to an in-process registry and
// builds ten templates from it: the first pull is cold, the next nine use
// the layer cache. It reports the times and the disk the ten templates
// and the cache use, against ten copies of the tree.
func BenchmarkImageTemplates(b *testing.B) {
	requireRoot(b)
	src := filepath.Join(os.Getenv("FENCE_TEST_TEMPLATES"), "base", "rootfs")
	if _, err := os.Stat(src); err != nil {
		b.Skipf("no base template to build an image of (FENCE_TEST_TEMPLATES): %v", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return tarDir(src), nil })
	if err != nil {
		b.Fatal(err)
	}
	reg := NewRegistry(b)
	t0 := time.Now()
	ref := reg.Push(b, "bench/base:1", Image(b, v1.Config{}, layer))
	b.Logf("pushed %s in %s", ref, time.Since(t0).Round(time.Millisecond))
	s := newStore(b, nil)
	for i := range 10 {
		t0 := time.Now()
		if _, err := s.BuildImage(b.Context(), fmt.Sprintf("t%d", i), ImageSource{Ref: ref}); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		b.Logf("template t%d: %s", i, d.Round(time.Millisecond))
		switch i {
		case 0:
			b.ReportMetric(d.Seconds(), "cold-s")
		case 1:
			b.ReportMetric(d.Seconds(), "cached-s")
		}
	}
	shared := diskUsed(s.Dir())
	one := diskUsed(src)
	b.Logf("ten templates and the layer cache use %d MiB; one copy of the tree uses %d MiB, ten %d MiB", shared>>20, one>>20, 10*one>>20)
	b.ReportMetric(float64(shared>>20), "MiB-10-shared")
	b.ReportMetric(float64(10*one>>20), "MiB-10-copies")
}

// diskUsed is the disk the files under dir use, hard links counted once.
func diskUsed(dir string) int64 {
	seen := map[uint64]bool{}
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !seen[st.Ino] {
			seen[st.Ino] = true
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// tarDir streams dir as a tar (regular files, directories, symlinks).
func tarDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
				return nil
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				link, _ = os.Readlink(p)
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name = rel
			if fi.IsDir() {
				h.Name += "/"
			}
			h.Uname, h.Gname = "", ""
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				defer f.Close()
				_, err = io.Copy(tw, f)
				return err
			}
			return nil
		})
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}
