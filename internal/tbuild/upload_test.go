package tbuild

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tbuild/content"
	"github.com/fencesandbox/fence/internal/tbuild/content/contenttest"
	"github.com/fencesandbox/fence/internal/template"
)

type noParents struct{}

func (noParents) Resolve(name string) (string, error) {
	return "", errors.New("no parent templates in this test")
}

func (noParents) ReadyPorts(name string) []uint16 { return nil }

func (noParents) Info(name string) (template.Info, error) {
	return template.Info{}, errors.New("no parent templates in this test")
}

func newTestService(t *testing.T) *Service {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(t.Context(), Options{Dir: filepath.Join(dir, "builds"), Store: st, Parents: noParents{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// An upload link takes one PUT: a second one is refused and drops what
// the first one kept (one of the two came from someone other than the
// client the link was given to); an upload for a hash already kept with
// other files is refused, and the kept files stay for later COPY steps.
func TestUploadLinks(t *testing.T) {
	s := newTestService(t)
	reg, err := s.Register(t.Context(), "uploads", nil, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	hash := strings.Repeat("ef", 32)
	final := s.content.ArchivePath(hash)
	link := func() string {
		t.Helper()
		_, token, err := s.FileStatus(reg.TemplateID, hash)
		if err != nil {
			t.Fatal(err)
		}
		return token
	}
	good := contenttest.TarFiles(t, time.Unix(0, 0), "app/a", "good")
	evil := contenttest.TarFiles(t, time.Unix(0, 0), "app/a", "evil")

	// The client's PUT, then someone who saw the link.
	tok := link()
	if err := s.Upload(t.Context(), tok, bytes.NewReader(good)); err != nil {
		t.Fatalf("first PUT: %v", err)
	}
	if err := s.Upload(t.Context(), tok, bytes.NewReader(good)); !errors.Is(err, api.ErrConflict) {
		t.Errorf("second PUT to the link = %v, want ErrConflict", err)
	}
	if _, err := os.Stat(final); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the archive of a link used twice is kept (%v)", err)
	}

	// Someone who saw the link first, then the client: the client's PUT is
	// refused and the other one's files are not kept.
	tok = link()
	if err := s.Upload(t.Context(), tok, bytes.NewReader(evil)); err != nil {
		t.Fatalf("first PUT: %v", err)
	}
	if err := s.Upload(t.Context(), tok, bytes.NewReader(good)); !errors.Is(err, api.ErrConflict) {
		t.Errorf("second PUT to the link = %v, want ErrConflict", err)
	}
	if present, _, _ := s.FileStatus(reg.TemplateID, hash); present {
		t.Error("the files of a link used twice are present")
	}

	// A refused upload spends its link and keeps nothing.
	tok = link()
	if err := s.Upload(t.Context(), tok, strings.NewReader("not a tar archive, not at all, no.......")); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("garbage PUT = %v, want ErrInvalidArgument", err)
	}
	if err := s.Upload(t.Context(), tok, bytes.NewReader(good)); !errors.Is(err, api.ErrConflict) {
		t.Errorf("PUT after a refused one = %v, want ErrConflict", err)
	}
	if present, _, _ := s.FileStatus(reg.TemplateID, hash); present {
		t.Error("a refused upload is present")
	}

	// Kept once, the hash names those files: another upload of other
	// files (a link given while present, as for forceUpload) is refused.
	if err := s.Upload(t.Context(), link(), bytes.NewReader(good)); err != nil {
		t.Fatalf("upload: %v", err)
	}
	if err := s.Upload(t.Context(), link(), bytes.NewReader(evil)); !errors.Is(err, api.ErrConflict) {
		t.Errorf("other files under a kept hash = %v, want ErrConflict", err)
	}
	if err := s.Upload(t.Context(), link(), bytes.NewReader(good)); err != nil {
		t.Errorf("the same files again (forceUpload) = %v, want accepted", err)
	}
	f, digest, err := s.content.OpenArchive(t.Context(), hash)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	want, _ := content.FilesDigest(t.Context(), bytes.NewReader(good), false)
	if digest != want {
		t.Error("a later COPY would not get the files first kept under the hash")
	}
	if err := s.Upload(t.Context(), "nosuchtoken", bytes.NewReader(good)); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("unknown link = %v, want ErrNotFound", err)
	}
}

// Distinct step argument lists have distinct cache keys, and so do a
// COPY's files hash and the files fence holds under it.
func TestStepKey(t *testing.T) {
	prev := strings.Repeat("0", 64)
	keys := map[string]string{}
	for name, k := range map[string]string{
		`RUN ["x","root"]`:    stepKey(prev, "RUN", []string{"x", "root"}, "", ""),
		`RUN ["x root"]`:      stepKey(prev, "RUN", []string{"x root"}, "", ""),
		`RUN ["x;root"]`:      stepKey(prev, "RUN", []string{"x;root"}, "", ""),
		`RUN ["x","","root"]`: stepKey(prev, "RUN", []string{"x", "", "root"}, "", ""),
		`RUN []`:              stepKey(prev, "RUN", nil, "", ""),
		`RUN [""]`:            stepKey(prev, "RUN", []string{""}, "", ""),
		`RUN ["",""]`:         stepKey(prev, "RUN", []string{"", ""}, "", ""),
		`ENV ["a","b c"]`:     stepKey(prev, "ENV", []string{"a", "b c"}, "", ""),
		`ENV ["a b","c"]`:     stepKey(prev, "ENV", []string{"a b", "c"}, "", ""),
		`COPY files 1`:        stepKey(prev, "COPY", []string{"a", "/b", "", ""}, "h", "d1"),
		`COPY files 2`:        stepKey(prev, "COPY", []string{"a", "/b", "", ""}, "h", "d2"),
		`COPY hash;digest`:    stepKey(prev, "COPY", []string{"a", "/b", "", ""}, "h;d1", ""),
	} {
		if other, ok := keys[k]; ok {
			t.Errorf("%s and %s share the cache key %s", name, other, k[:12])
		}
		keys[k] = name
	}
	//lint:ignore SA4000 the same step twice: its key must not change
	if stepKey(prev, "RUN", []string{"x", "root"}, "", "") != stepKey(prev, "RUN", []string{"x", "root"}, "", "") {
		t.Error("one step has two keys")
	}
}
