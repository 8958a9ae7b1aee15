package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/oci"
)

// ImageInfo records the container image a template was unpacked from.
type ImageInfo struct {
	// Ref is the reference as resolved, or the archive's path.
	Ref string `json:"ref"`
	// Digest pins the image: its manifest digest (a `docker save`
	// tarball's image ID).
	Digest string `json:"digest"`
	// Layers are the layers' DiffIDs, bottom first: the layer cache keeps
	// them while the template exists.
	Layers []string `json:"layers"`
}

// ImageSource is where BuildImage takes an image from: a registry
// reference, or an archive (an OCI layout directory or a `docker save`
// tarball) for hosts without a registry.
type ImageSource struct {
	// Ref is a registry reference (debian:bookworm, ghcr.io/o/r@sha256:…),
	// or with Archive, the image to take from the archive (empty: its only
	// one).
	Ref string
	// Archive is the path of an OCI layout directory or docker-save tar.
	Archive string
	// Auth, Platform and the limits are passed to the puller.
	Auth     *oci.Auth
	Platform string
	MaxBytes int64
	MaxFiles int64
}

// LayerCache opens the store's image layer cache.
func (s *Store) LayerCache() (*oci.Cache, error) {
	return oci.NewCache(s.layerCache)
}

// BuildImage builds template name from a container image: its layers are
// pulled (or read from the archive) into the shared layer cache and
// applied into a new tree, which replaces the template atomically if it
// exists. The image's Env, WorkingDir and User become the Info's
// defaults, and its reference and digest are recorded. A failed build
// leaves no template and keeps any previous one.
func (s *Store) BuildImage(ctx context.Context, name string, src ImageSource) (Info, error) {
	if err := ValidateName(name); err != nil {
		return Info{}, err
	}
	if src.Ref == "" && src.Archive == "" {
		return Info{}, fmt.Errorf("template %q: want an image reference or an archive: %w", name, api.ErrInvalidArgument)
	}
	cache, err := s.LayerCache()
	if err != nil {
		return Info{}, err
	}
	opts := oci.Options{Auth: src.Auth, Platform: src.Platform, Progress: s.progress, MaxBytes: src.MaxBytes, MaxFiles: src.MaxFiles}
	info, err := s.buildTree(ctx, name, true, "", func(ctx context.Context, rootfs string) (Info, error) {
		var img oci.Image
		var err error
		if src.Archive != "" {
			img, err = cache.Import(ctx, src.Archive, src.Ref, rootfs, opts)
		} else {
			img, err = cache.Unpack(ctx, src.Ref, rootfs, opts)
		}
		if err != nil {
			return Info{}, err
		}
		return Info{
			Source:  fmt.Sprintf("image %s@%s", img.Ref, img.Digest),
			Image:   &ImageInfo{Ref: img.Ref, Digest: img.Digest, Layers: img.Layers},
			Env:     img.Config.Env,
			WorkDir: img.Config.WorkingDir,
			User:    img.Config.User,
		}, nil
	})
	s.gcSoon(ctx)
	return info, err
}

// Info returns the description of a built template (api.ErrNotFound if it
// is not built).
func (s *Store) Info(name string) (Info, error) {
	return s.info(name)
}

// GCLayers removes the cached image layers no built template uses and
// returns the bytes freed. Files a template still links are freed only
// with the template.
func (s *Store) GCLayers(ctx context.Context) (int64, error) {
	if _, err := os.Stat(s.layerCache); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	cache, err := s.LayerCache()
	if err != nil {
		return 0, err
	}
	infos, err := s.List()
	if err != nil {
		return 0, err
	}
	var keep []string
	for _, in := range infos {
		if in.Image != nil {
			keep = append(keep, in.Image.Layers...)
		}
	}
	return cache.GC(ctx, keep)
}

// gcSoon collects unused layers, giving up quickly when a pull holds the
// cache (the next build or removal collects them).
func (s *Store) gcSoon(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if freed, err := s.GCLayers(ctx); err != nil {
		s.log.DebugContext(ctx, "layer cache gc", "err", err)
	} else if freed > 0 {
		s.log.InfoContext(ctx, "layer cache gc", "freed", freed)
	}
}

// definitionVersion is bumped when a built-in template's build changes in
// a way its packages and files do not show (a hook, an option).
const definitionVersion = 2

// definition is the digest of what built-in template name is built from.
func definition(name string) string {
	h := sha256.New()
	fmt.Fprintf(h, "v%d\n%s\n", definitionVersion, name)
	switch name {
	case "base":
		fmt.Fprintf(h, "%s\n%s\n", baseSuite, strings.Join(basePackages, ","))
	case "code-interpreter":
		fmt.Fprintf(h, "%s\n%s\n", baseSuite, strings.Join(codeInterpreterPackages, ","))
		for _, f := range []string{"server.py", "fence_kernel.py"} {
			b, _ := codeInterpreterFiles.ReadFile("codeinterp/" + f)
			fmt.Fprintf(h, "%s %d\n", f, len(b))
			h.Write(b)
		}
	case "mcp-gateway":
		fmt.Fprintf(h, "%s\n%s -> %s\n", definition("base"), mcpGatewayLink, mcpGatewayTarget)
	case "desktop":
		fmt.Fprintf(h, "%s\n%s\n%s\n", baseSuite, strings.Join(desktopPackages, ","), strings.Join(desktopHooks, "\n"))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
