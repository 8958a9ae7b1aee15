package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Cache is a content-addressed layer cache shared by every template.
// Its methods are safe for concurrent use, also across processes.
type Cache struct {
	dir string
}

// NewCache opens (creating if needed) the layer cache under dir. Work
// directories left by a crashed extraction are removed when no other
// process uses the cache.
func NewCache(dir string) (*Cache, error) {
	if dir == "" {
		return nil, errors.New("layer cache: empty dir")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("layer cache: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating layer cache: %w", err)
	}
	c := &Cache{dir: dir}
	if unlock, err := c.lock(context.Background(), unix.LOCK_EX|unix.LOCK_NB); err == nil {
		c.removeTemps()
		unlock()
	}
	return c, nil
}

// Dir returns the cache's directory.
func (c *Cache) Dir() string { return c.dir }

// lock takes the cache's flock (how: LOCK_SH or LOCK_EX, optionally
// LOCK_NB), polling so that ctx can interrupt the wait.
func (c *Cache) lock(ctx context.Context, how int) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(c.dir, ".lock"), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening layer cache lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if how&unix.LOCK_NB != 0 || (!errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR)) {
			f.Close()
			return nil, fmt.Errorf("locking layer cache: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for layer cache lock: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// layerDirRE matches a cached layer's directory name.
var layerDirRE = regexp.MustCompile(`^sha256-[0-9a-f]{64}$`)

func (c *Cache) layerDir(diffID v1.Hash) string {
	return filepath.Join(c.dir, diffID.Algorithm+"-"+diffID.Hex)
}

// removeTemps deletes the work directories of interrupted extractions; the
// caller holds the exclusive lock.
func (c *Cache) removeTemps() int64 {
	entries, _ := os.ReadDir(c.dir)
	var freed int64
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			p := filepath.Join(c.dir, e.Name())
			freed += diskUsage(p)
			os.RemoveAll(p)
		}
	}
	return freed
}

// GC removes cached layers no template uses; keep lists the layer digests
// still in use. It returns the bytes freed (blocks of files whose last
// link went with the layer; a file still linked from a template frees
// nothing until that template is removed).
func (c *Cache) GC(ctx context.Context, keep []string) (int64, error) {
	unlock, err := c.lock(ctx, unix.LOCK_EX)
	if err != nil {
		return 0, err
	}
	defer unlock()
	kept := map[string]bool{}
	for _, k := range keep {
		kept[strings.Replace(k, ":", "-", 1)] = true
	}
	freed := c.removeTemps()
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return freed, fmt.Errorf("listing layer cache: %w", err)
	}
	for _, e := range entries {
		if !layerDirRE.MatchString(e.Name()) || kept[e.Name()] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return freed, err
		}
		p := filepath.Join(c.dir, e.Name())
		// Rename first, so a half-removed layer is never taken for a
		// cached one.
		trash := filepath.Join(c.dir, ".tmp-gc-"+randomSuffix())
		if err := os.Rename(p, trash); err != nil {
			return freed, fmt.Errorf("removing layer %s: %w", e.Name(), err)
		}
		freed += diskUsage(trash)
		if err := os.RemoveAll(trash); err != nil {
			return freed, fmt.Errorf("removing layer %s: %w", e.Name(), err)
		}
	}
	return freed, nil
}

// Layers lists the DiffIDs of the cached layers.
func (c *Cache) Layers() ([]string, error) {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("listing layer cache: %w", err)
	}
	var out []string
	for _, e := range entries {
		if layerDirRE.MatchString(e.Name()) {
			if _, err := os.Stat(filepath.Join(c.dir, e.Name(), metaFile)); err == nil {
				out = append(out, strings.Replace(e.Name(), "-", ":", 1))
			}
		}
	}
	return out, nil
}

// diskUsage is the space the files under p whose only link is there take
// (what removing p frees).
func diskUsage(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (st.Nlink == 1 || d.IsDir()) {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// unpack applies src's layers into dst, extracting those not cached.
func (c *Cache) unpack(ctx context.Context, src source, dst string, opts Options) (img Image, err error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if opts.MaxLayers <= 0 {
		opts.MaxLayers = DefaultMaxLayers
	}
	p := newProgress(opts.Progress)
	entries, err := os.ReadDir(dst)
	if err != nil {
		return Image{}, fmt.Errorf("unpack destination: %w", err)
	}
	if len(entries) != 0 {
		return Image{}, fmt.Errorf("unpack destination %s is not empty", dst)
	}
	defer func() {
		if err != nil {
			emptyDir(dst)
		}
	}()
	cf, layers, err := src.check(opts)
	if err != nil {
		return Image{}, err
	}
	diffIDs := cf.RootFS.DiffIDs

	unlock, err := c.lock(ctx, unix.LOCK_SH)
	if err != nil {
		return Image{}, err
	}
	defer unlock()

	img = Image{Ref: src.ref, Digest: src.digest, Config: Config{
		Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
		Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd,
	}}
	for _, id := range diffIDs {
		img.Layers = append(img.Layers, id.String())
	}
	p.linef("%s: %s, %d layers", src.ref, src.digest, len(layers))
	start := time.Now()
	metas, err := c.cacheLayers(ctx, src.ref, layers, diffIDs, opts, p)
	if err != nil {
		return Image{}, err
	}
	t1 := time.Now()
	root, err := os.OpenRoot(dst)
	if err != nil {
		return Image{}, fmt.Errorf("opening %s: %w", dst, err)
	}
	defer root.Close()
	for i := range layers {
		if err := ctx.Err(); err != nil {
			return Image{}, err
		}
		if err := apply(root, c.layerDir(diffIDs[i]), metas[i], opts.Copy); err != nil {
			return Image{}, fmt.Errorf("%s: applying layer %d/%d %s: %w", src.ref, i+1, len(layers), short(diffIDs[i]), err)
		}
		img.Bytes += metas[i].Bytes
		img.Files += metas[i].Files
	}
	p.linef("%s: root filesystem of %s in %s (layers %s, linking %s)", src.ref, humanSize(img.Bytes),
		time.Since(start).Round(time.Millisecond), t1.Sub(start).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	return img, nil
}

// check reads the image's configuration and layers and checks them
// against opts' limits before anything is downloaded: one sha256 diff_id
// a layer, no more layers than MaxLayers, and (with a manifest) no more
// compressed bytes than MaxBytes.
func (src source) check(opts Options) (*v1.ConfigFile, []v1.Layer, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%s: %s: %w", src.ref, fmt.Sprintf(format, a...), ErrInvalidImage)
	}
	cf, err := src.img.ConfigFile()
	if err != nil {
		return nil, nil, bad("reading the image configuration: %v", err)
	}
	layers, err := src.img.Layers()
	if err != nil {
		return nil, nil, bad("reading the image manifest: %v", err)
	}
	diffIDs := cf.RootFS.DiffIDs
	if len(diffIDs) != len(layers) {
		return nil, nil, bad("%d layers but %d diff_ids in the configuration", len(layers), len(diffIDs))
	}
	if len(layers) > opts.MaxLayers {
		return nil, nil, bad("%d layers, more than the limit of %d", len(layers), opts.MaxLayers)
	}
	for _, d := range diffIDs {
		if d.Algorithm != "sha256" || len(d.Hex) != 64 {
			return nil, nil, bad("layer digest %q is not sha256", d.String())
		}
	}
	if src.manifest {
		m, err := src.img.Manifest()
		if err != nil {
			return nil, nil, bad("reading the image manifest: %v", err)
		}
		var total int64
		for _, l := range m.Layers {
			total += l.Size
		}
		if total > opts.MaxBytes {
			return nil, nil, bad("layers of %s compressed, more than the limit of %s", humanSize(total), humanSize(opts.MaxBytes))
		}
	}
	return cf, layers, nil
}

// cacheLayers extracts into the cache each layer of image ref that is not
// there yet, within opts' size and file budgets (which cached layers
// count against too), and gives every layer's description.
func (c *Cache) cacheLayers(ctx context.Context, ref string, layers []v1.Layer, diffIDs []v1.Hash, opts Options, p *progress) ([]layerMeta, error) {
	metas := make([]layerMeta, len(layers))
	budget := limits{bytes: opts.MaxBytes, files: opts.MaxFiles}
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		id := diffIDs[i]
		t0 := time.Now()
		m, cached, err := c.readMeta(id)
		if err != nil {
			return nil, err
		}
		if !cached {
			m, err = c.extract(ctx, l, id, &budget, p, fmt.Sprintf("layer %d/%d %s", i+1, len(layers), short(id)))
			if err != nil {
				return nil, fmt.Errorf("%s: layer %d/%d %s: %w", ref, i+1, len(layers), short(id), err)
			}
		} else if err := budget.take(m.Bytes, m.Files); err != nil {
			return nil, fmt.Errorf("%s: layer %d/%d %s: %w", ref, i+1, len(layers), short(id), err)
		}
		metas[i] = m
		how := "extracted"
		if cached {
			how = "cached"
		}
		p.linef("layer %d/%d %s: %s, %d files, %s in %s", i+1, len(layers), short(id), humanSize(m.Bytes), m.Files, how,
			time.Since(t0).Round(time.Millisecond))
	}
	return metas, nil
}

// readMeta returns a cached layer's description, and whether it is cached.
func (c *Cache) readMeta(id v1.Hash) (layerMeta, bool, error) {
	b, err := os.ReadFile(filepath.Join(c.layerDir(id), metaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return layerMeta{}, false, nil
	}
	if err != nil {
		return layerMeta{}, false, fmt.Errorf("reading cached layer %s: %w", short(id), err)
	}
	var m layerMeta
	if err := json.Unmarshal(b, &m); err != nil || m.Version != metaVersion {
		// Unreadable or from another version: extract it again.
		return layerMeta{}, false, nil
	}
	return m, true, nil
}

// emptyDir removes everything inside dir.
func emptyDir(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// short abbreviates a digest for progress lines.
func short(h v1.Hash) string {
	if len(h.Hex) > 12 {
		return h.Algorithm + ":" + h.Hex[:12]
	}
	return h.String()
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
