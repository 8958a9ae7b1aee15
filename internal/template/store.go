package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
)

// FormatVersion is the version of the on-disk template layout. A template
// built with another version is treated as absent and rebuilt by Build.
const FormatVersion = 1

const infoFile = "template.json"

// Options configure a Store.
type Options struct {
	// Dir holds the templates. It is created if missing. Required.
	Dir string
	// Logger receives build events. If nil, logs are discarded.
	Logger *slog.Logger
	// Progress receives human-readable progress lines during a build. If
	// nil, progress is discarded.
	Progress io.Writer
	// LayerCache is the directory of the image layer cache (see package
	// oci). It must be on the filesystem of Dir, so that templates share
	// the cached files' inodes. Default: Dir/.layers.
	LayerCache string
}

// BuildOptions are per-call knobs of BuildWithOptions.
type BuildOptions struct {
	// Force rebuilds a template that already exists. The old tree is
	// replaced atomically once the new one is complete.
	Force bool
}

// Info describes a built template; it is stored as template.json.
type Info struct {
	Name          string    `json:"name"`
	BuiltAt       time.Time `json:"builtAt"`
	SizeBytes     int64     `json:"sizeBytes"` // apparent size of the rootfs files
	Source        string    `json:"source"`    // how it was built, for humans
	FormatVersion int       `json:"formatVersion"`
	// ReadyPorts are TCP ports a sandbox of this template serves once it
	// has started (the code-interpreter server's 49999): a create waits
	// for them to accept connections before it returns.
	ReadyPorts []uint16 `json:"readyPorts,omitempty"`
	// Definition is a digest of what a built-in template is built from
	// (its packages, hooks and files): Build rebuilds a template whose
	// Definition differs from the current one, so a changed definition
	// reaches machines that built the template before.
	Definition string `json:"definition,omitempty"`
	// Image is set for a template unpacked from a container image.
	Image *ImageInfo `json:"image,omitempty"`
	// Env (KEY=VALUE), WorkDir and User are the defaults a sandbox of the
	// template starts with (from the image's configuration); empty means
	// fence's defaults.
	Env     []string `json:"env,omitempty"`
	WorkDir string   `json:"workDir,omitempty"`
	User    string   `json:"user,omitempty"`
	// RootFS is the absolute path of the template's root filesystem. It is
	// not stored.
	RootFS string `json:"-"`
}

// Store builds, finds and removes templates under one directory.
// Its methods are safe for concurrent use.
type Store struct {
	dir      string
	log      *slog.Logger
	progress io.Writer
	builders map[string]builder
	// layerCache is Options.LayerCache; the cache is opened on first use.
	layerCache string
}

// builder fills rootfs (an existing empty directory) and returns a
// description of the source it was built from.
type builder func(ctx context.Context, s *Store, rootfs string) (source string, err error)

// New returns a Store for opts.Dir, creating the directory if needed.
func New(opts Options) (*Store, error) {
	if opts.Dir == "" {
		return nil, fmt.Errorf("template store: empty Dir: %w", api.ErrInvalidArgument)
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolving template dir: %w", err)
	}
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	s := &Store{
		dir:        dir,
		layerCache: opts.LayerCache,
		log:        opts.Logger,
		progress:   opts.Progress,
		builders: map[string]builder{
			"minimal":          buildMinimal,
			"base":             buildBase,
			"code-interpreter": buildCodeInterpreter,
			"mcp-gateway":      buildMcpGateway,
			"desktop":          buildDesktop,
		},
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.progress == nil {
		s.progress = io.Discard
	}
	if s.layerCache == "" {
		s.layerCache = filepath.Join(dir, ".layers")
	}
	return s, nil
}

// Dir returns the store's absolute directory.
func (s *Store) Dir() string { return s.dir }

// Names returns the names of the templates this Store knows how to build.
func (s *Store) Names() []string {
	names := make([]string, 0, len(s.builders))
	for n := range s.builders {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// nameRE matches a template name of at most 64 bytes (checked apart: a
// bounded repetition compiles into one copy of the class per repetition,
// at every start of the binary).
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

const maxNameLen = 64

// ValidateName reports whether name is a well-formed template name, with an
// error wrapping api.ErrInvalidArgument if not.
func ValidateName(name string) error {
	if len(name) > maxNameLen || !nameRE.MatchString(name) {
		return fmt.Errorf("invalid template name %q (want [a-z0-9][a-z0-9._-]*, at most 64 bytes): %w", name, api.ErrInvalidArgument)
	}
	return nil
}

// Build builds the named template unless it already exists.
// See BuildWithOptions.
func (s *Store) Build(ctx context.Context, name string) error {
	return s.BuildWithOptions(ctx, name, BuildOptions{})
}

// BuildWithOptions builds the named template ("minimal", "base",
// "code-interpreter", "mcp-gateway" (which needs base built) or "desktop"). An unknown or malformed name is an error wrapping
// api.ErrInvalidArgument. If the template exists with the current
// definition and opts.Force is false, it does nothing.
func (s *Store) BuildWithOptions(ctx context.Context, name string, opts BuildOptions) (err error) {
	if err := ValidateName(name); err != nil {
		return err
	}
	build, ok := s.builders[name]
	if !ok {
		return fmt.Errorf("unknown template %q (known: %s): %w", name, strings.Join(s.Names(), ", "), api.ErrInvalidArgument)
	}
	def := definition(name)
	_, err = s.buildTree(ctx, name, opts.Force, def, func(ctx context.Context, rootfs string) (Info, error) {
		source, err := build(ctx, s, rootfs)
		return Info{Source: source, Definition: def, ReadyPorts: readyPorts[name]}, err
	})
	return err
}

// buildTree builds template name with fill, which fills rootfs (an empty
// directory) and returns the Info fields it decides. Unless force, a
// template that exists with definition def (when def is not empty) is
// kept, and its Info returned.
func (s *Store) buildTree(ctx context.Context, name string, force bool, def string, fill func(ctx context.Context, rootfs string) (Info, error)) (_ Info, err error) {
	unlock, err := s.lock(ctx)
	if err != nil {
		return Info{}, err
	}
	defer unlock()
	s.removeLeftovers(ctx)

	if !force && def != "" {
		if info, err := s.info(name); err == nil {
			if info.Definition == def {
				s.log.DebugContext(ctx, "template exists", "template", name)
				return info, nil
			}
			fmt.Fprintf(s.progress, "%s: its definition changed since it was built: rebuilding\n", name)
		}
	}
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("building template %q: %w", name, err)
	}

	work := filepath.Join(s.dir, ".build-"+name+"-"+randomSuffix())
	rootfs := filepath.Join(work, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return Info{}, fmt.Errorf("creating build dir: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			if rerr := os.RemoveAll(work); rerr != nil {
				s.log.WarnContext(ctx, "removing failed build", "dir", work, "err", rerr)
			}
		}
	}()

	start := time.Now()
	s.log.InfoContext(ctx, "building template", "template", name)
	info, err := fill(ctx, rootfs)
	if err != nil {
		return Info{}, fmt.Errorf("building template %q: %w", name, err)
	}
	if err := finalize(rootfs); err != nil {
		return Info{}, fmt.Errorf("finalizing template %q: %w", name, err)
	}
	size, err := treeSize(rootfs)
	if err != nil {
		return Info{}, fmt.Errorf("measuring template %q: %w", name, err)
	}
	info.Name, info.BuiltAt, info.SizeBytes, info.FormatVersion = name, time.Now().UTC(), size, FormatVersion
	if err := writeInfo(filepath.Join(work, infoFile), info); err != nil {
		return Info{}, err
	}
	// Last chance to give up: after the rename the template exists.
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("building template %q: %w", name, err)
	}
	if err := s.commit(work, filepath.Join(s.dir, name)); err != nil {
		return Info{}, fmt.Errorf("installing template %q: %w", name, err)
	}
	committed = true
	s.log.InfoContext(ctx, "built template", "template", name, "size", size, "duration", time.Since(start))
	fmt.Fprintf(s.progress, "%s: built (%s) in %s\n", name, humanSize(size), time.Since(start).Round(100*time.Millisecond))
	info.RootFS = filepath.Join(s.dir, name, "rootfs")
	return info, nil
}

// commit renames the finished build work into place at final. If final
// exists (a forced rebuild), the two are exchanged atomically and the old
// tree, now at work, is removed.
func (s *Store) commit(work, final string) error {
	err := unix.Renameat2(unix.AT_FDCWD, work, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) {
		if err := unix.Renameat2(unix.AT_FDCWD, work, unix.AT_FDCWD, final, unix.RENAME_EXCHANGE); err != nil {
			return fmt.Errorf("exchanging %s with %s: %w", work, final, err)
		}
		if err := os.RemoveAll(work); err != nil {
			s.log.Warn("removing replaced template", "dir", work, "err", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("renaming %s to %s: %w", work, final, err)
	}
	return syncDir(s.dir)
}

// Resolve returns the root filesystem of a built template. A malformed name
// wraps api.ErrInvalidArgument; a template that is not built wraps
// api.ErrNotFound and says how to build it.
func (s *Store) Resolve(name string) (rootfs string, err error) {
	info, err := s.info(name)
	if err != nil {
		return "", err
	}
	return info.RootFS, nil
}

// ReadyPorts returns the ports a sandbox of the named template serves once
// started (see Info.ReadyPorts); none for a template that is not built.
func (s *Store) ReadyPorts(name string) []uint16 {
	info, err := s.info(name)
	if err != nil {
		return nil
	}
	return info.ReadyPorts
}

// info reads the Info of a built template.
func (s *Store) info(name string) (Info, error) {
	if err := ValidateName(name); err != nil {
		return Info{}, err
	}
	if target, ok := aliases[name]; ok {
		name = target
	}
	notBuilt := func(why string) error {
		return fmt.Errorf("template %q %s: run `fence template build %s`: %w", name, why, name, api.ErrNotFound)
	}
	dir := filepath.Join(s.dir, name)
	b, err := os.ReadFile(filepath.Join(dir, infoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, notBuilt("is not built")
	}
	if err != nil {
		return Info{}, fmt.Errorf("reading template %q: %w", name, err)
	}
	var info Info
	if err := json.Unmarshal(b, &info); err != nil {
		return Info{}, notBuilt(fmt.Sprintf("has a corrupt %s (%v)", infoFile, err))
	}
	if info.FormatVersion != FormatVersion {
		return Info{}, notBuilt(fmt.Sprintf("has format version %d, want %d", info.FormatVersion, FormatVersion))
	}
	info.Name = name
	info.RootFS = filepath.Join(dir, "rootfs")
	if fi, err := os.Lstat(info.RootFS); err != nil || !fi.IsDir() {
		return Info{}, notBuilt("has no rootfs directory")
	}
	return info, nil
}

// List returns the built templates, sorted by name. Directories that are
// not valid templates are skipped.
func (s *Store) List() ([]Info, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var infos []Info
	for _, e := range entries {
		if !e.IsDir() || ValidateName(e.Name()) != nil {
			continue
		}
		info, err := s.info(e.Name())
		if err != nil {
			s.log.Debug("skipping template", "template", e.Name(), "err", err)
			continue
		}
		infos = append(infos, info)
	}
	return infos, nil // ReadDir sorts by name
}

// Remove deletes a template. It first renames the template out of the way,
// so Resolve never returns a half-removed tree. A template that does not
// exist wraps api.ErrNotFound. Remove does not check whether a sandbox still
// uses the template.
func (s *Store) Remove(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	unlock, err := s.lock(context.Background())
	if err != nil {
		return err
	}
	defer unlock()
	dir := filepath.Join(s.dir, name)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("template %q does not exist: %w", name, api.ErrNotFound)
	}
	trash := filepath.Join(s.dir, ".remove-"+name+"-"+randomSuffix())
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("removing template %q: %w", name, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("removing template %q: %w", name, err)
	}
	s.gcSoon(context.Background())
	return nil
}

// lock takes the store's flock, polling so that ctx can interrupt the wait.
func (s *Store) lock(ctx context.Context) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening template lock: %w", err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking template dir: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for template lock: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return func() { f.Close() }, nil // closing the fd drops the lock
}

// removeLeftovers deletes the work directories of crashed builds and
// removals. The caller holds the lock, so none of them is in use.
func (s *Store) removeLeftovers(ctx context.Context) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		s.log.WarnContext(ctx, "listing template dir", "err", err)
		return
	}
	for _, e := range entries {
		n := e.Name()
		if !strings.HasPrefix(n, ".build-") && !strings.HasPrefix(n, ".remove-") {
			continue
		}
		p := filepath.Join(s.dir, n)
		s.log.InfoContext(ctx, "removing stale template work dir", "dir", p)
		if err := os.RemoveAll(p); err != nil {
			s.log.WarnContext(ctx, "removing stale template work dir", "dir", p, "err", err)
		}
	}
}

func writeInfo(path string, info Info) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", infoFile, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("writing %s: %w", infoFile, err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", infoFile, err)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// treeSize sums the apparent sizes of the regular files and symlinks under
// root, counting hard-linked files once.
func treeSize(root string) (int64, error) {
	type key struct{ dev, ino uint64 }
	seen := map[key]bool{}
	var total int64
	err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			k := key{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += fi.Size()
		return nil
	})
	return total, err
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

// privateDir makes dir (mode 0700) or, when it exists with access for
// group or others, takes that access away. Template trees keep their
// files' owners (an idmapped mount maps them for each sandbox), so a host
// user whose uid owns files in a template could otherwise change every
// sandbox made from it; only the daemon's user may reach into the store.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating template dir: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("template dir: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("template dir %s is not a directory", dir)
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, st.Mode().Perm()&0o700); err != nil {
			return fmt.Errorf("template dir %s: taking group and other access away: %w", dir, err)
		}
	}
	return nil
}
