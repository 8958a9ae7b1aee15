package template

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/oci"
	. "github.com/fencesandbox/fence/internal/oci/ocitest"
)

// TestBuildImage builds a template from an image on an in-process
// registry: the tree is the image's, finalized like every template; Info
// records the reference, digest and layers, and the image's defaults;
// removing the template collects its layers.
func TestBuildImage(t *testing.T) {
	requireRoot(t)
	reg := NewRegistry(t)
	img := Image(t, v1.Config{Env: []string{"A=1"}, WorkingDir: "/work", User: "user"},
		Layer(t, Dir("etc/", 0o755), File("etc/hello", 0o644, "hello\n"), Symlink("etc/resolv.conf", "/run/systemd/resolve/stub-resolv.conf"),
			Dir("dev/", 0o755), File("dev/junk", 0o644, "x")),
		Layer(t, Dir("work/", 0o755), File("work/app", 0o755, "app\n")))
	ref := reg.Push(t, "tmpl/img:1", img)
	s := newStore(t, nil)
	info, err := s.BuildImage(t.Context(), "img", ImageSource{Ref: ref})
	if err != nil {
		t.Fatalf("BuildImage: %v", err)
	}
	digest, _ := img.Digest()
	if info.Image == nil || info.Image.Digest != digest.String() || len(info.Image.Layers) != 2 ||
		info.WorkDir != "/work" || info.User != "user" || strings.Join(info.Env, ",") != "A=1" {
		t.Errorf("Info = %+v, image %+v; want the digest, 2 layers and the image's defaults", info, info.Image)
	}
	got, err := s.Info("img")
	if err != nil || got.Image == nil || got.Image.Digest != digest.String() || got.RootFS == "" {
		t.Errorf("Info(img) = %+v, %v", got, err)
	}
	rootfs, err := s.Resolve("img")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "work/app")); err != nil || string(b) != "app\n" {
		t.Errorf("work/app = %q, %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, "etc/resolv.conf")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("etc/resolv.conf = %v, %v; want the regular file of every template", fi, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(rootfs, "dev")); len(entries) != 0 {
		t.Errorf("/dev holds %d entries, want none", len(entries))
	}
	cache, _ := s.LayerCache()
	if layers, _ := cache.Layers(); len(layers) != 2 {
		t.Errorf("cache holds %v, want the 2 layers", layers)
	}
	// A rebuild from the cache replaces the template.
	if _, err := s.BuildImage(t.Context(), "img", ImageSource{Ref: ref}); err != nil {
		t.Fatalf("second BuildImage: %v", err)
	}
	assertNoWorkDirs(t, s)
	if err := s.Remove("img"); err != nil {
		t.Fatal(err)
	}
	if layers, _ := cache.Layers(); len(layers) != 0 {
		t.Errorf("after Remove the cache holds %v, want nothing", layers)
	}
	if _, err := s.BuildImage(t.Context(), "x", ImageSource{}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Errorf("BuildImage without a source = %v, want ErrInvalidArgument", err)
	}
}

// TestBuildImageHostileEtc builds templates from images whose /etc is a
// symlink out of the tree, absolute or climbing: finalizing the template
// (which writes /etc/resolv.conf) must not follow it to the host. The
// build fails, the host directory is untouched, and no template is left.
func TestBuildImageHostileEtc(t *testing.T) {
	requireRoot(t)
	reg := NewRegistry(t)
	host := t.TempDir()
	climb := strings.Repeat("../", 20) + strings.TrimPrefix(host, "/")
	s := newStore(t, nil)
	for i, target := range []string{host, climb} {
		ref := reg.Push(t, "hostile/etc:"+string(rune('a'+i)), Image(t, v1.Config{}, Layer(t, Symlink("etc", target))))
		_, err := s.BuildImage(t.Context(), "evil", ImageSource{Ref: ref})
		t.Logf("BuildImage(etc -> %s): %v", target, err)
		if err == nil {
			t.Errorf("BuildImage(etc -> %s) succeeded", target)
		}
		if entries, _ := os.ReadDir(host); len(entries) != 0 {
			t.Fatalf("the build wrote %d entries into the host directory %s", len(entries), host)
		}
		if _, err := s.Resolve("evil"); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Resolve(evil) = %v after a failed build, want ErrNotFound", err)
		}
		assertNoWorkDirs(t, s)
	}
}

// TestBuildImageBad builds from a malformed image and a missing one: a
// clear error, and the previous template of that name stays.
func TestBuildImageBad(t *testing.T) {
	requireRoot(t)
	reg := NewRegistry(t)
	good := reg.Push(t, "ok/img:1", Image(t, v1.Config{}, Layer(t, File("ok", 0o644, "ok"))))
	bad := reg.Push(t, "bad/img:1", Image(t, v1.Config{}, Layer(t, File("../../x", 0o644, "x"))))
	s := newStore(t, nil)
	if _, err := s.BuildImage(t.Context(), "t", ImageSource{Ref: good}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BuildImage(t.Context(), "t", ImageSource{Ref: bad}); !errors.Is(err, oci.ErrInvalidImage) {
		t.Errorf("BuildImage(bad) = %v, want ErrInvalidImage", err)
	}
	if _, err := s.BuildImage(t.Context(), "t", ImageSource{Ref: reg.Host + "/missing/img:1"}); err == nil {
		t.Error("BuildImage(missing) succeeded")
	}
	rootfs, err := s.Resolve("t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "ok")); err != nil {
		t.Errorf("the failed builds replaced the previous template: %v", err)
	}
	assertNoWorkDirs(t, s)
}

// TestBuildRebuildsChangedDefinition builds minimal, then records another
// definition in its template.json, as a template built by an older fence
// would have: Build rebuilds it, where it keeps one whose definition is
// current.
func TestBuildRebuildsChangedDefinition(t *testing.T) {
	requireRoot(t)
	s := newStore(t, nil)
	if err := s.Build(t.Context(), "minimal"); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info("minimal")
	if err != nil || info.Definition != definition("minimal") {
		t.Fatalf("Info(minimal) = %+v, %v; want Definition %s", info, err, definition("minimal"))
	}
	marker := filepath.Join(info.RootFS, "marker")
	os.WriteFile(marker, nil, 0o644)
	if err := s.Build(t.Context(), "minimal"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("an unchanged definition was rebuilt: %v", err)
	}
	infoPath := filepath.Join(s.Dir(), "minimal", infoFile)
	b, _ := os.ReadFile(infoPath)
	var raw map[string]any
	json.Unmarshal(b, &raw)
	delete(raw, "definition") // what an older fence wrote
	b, _ = json.Marshal(raw)
	if err := os.WriteFile(infoPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Build(t.Context(), "minimal"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a template built from another definition was kept")
	}
	if d := definition("base"); d == definition("code-interpreter") || d == definition("minimal") {
		t.Error("two templates share a definition digest")
	}
}
