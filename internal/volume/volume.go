// Package volume keeps E2B's volumes: a team's named storage that outlives
// its sandboxes, mounted into new sandboxes by name and read and written
// from outside through the content API (content.go).
//
// # Storage
//
// Each volume is its own ext4 filesystem in a sparse image file as large as
// the volume's limit, loop-mounted under the data dir (internal/quota with
// Options.Durable: a journal and write barriers, so that what an fsync
// returned for survives a crash of the daemon or the host):
//
//	<Dir>/images/<volume ID>.img   the image
//	<Dir>/mnt/<volume ID>/         its mount, the volume's root
//
// Writing past the limit fails with ENOSPC, inside a sandbox and through
// the content API alike; the host's filesystem holds only the image. The
// files on disk carry the ids they have inside a sandbox (the root of a new
// volume is the templates' user's, 1000:1000): a sandbox mounts the volume
// idmapped through its own user namespace, as it mounts its template.
//
// # Guarantees
//
//   - A volume belongs to the team that made it; every method takes the
//     team, and another team's volume answers exactly like a missing one.
//   - Create makes the filesystem before the record, Delete removes the
//     record before the filesystem: a crash leaves at worst a filesystem
//     without a record, which Open removes (unmounting it; its loop device
//     detaches by itself). Open mounts again every recorded volume whose
//     mount went (a reboot).
//   - A volume mounted by a running or paused sandbox is not deleted
//     (Delete wraps api.ErrConflict); creates that mount volumes hold
//     Service.Use until their sandbox's mounts are recorded, so a delete
//     cannot slip between the check and the mount.
package volume

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/quota"
	"github.com/fencesandbox/fence/internal/store"
)

// Store is the part of *store.Store the volumes are recorded in.
type Store interface {
	InsertVolume(ctx context.Context, v *store.Volume) error
	Volumes(ctx context.Context, team string) ([]store.Volume, error)
	VolumeByID(ctx context.Context, team, id string) (store.Volume, error)
	VolumeByName(ctx context.Context, team, name string) (store.Volume, error)
	DeleteVolume(ctx context.Context, team, id string) error
	InsertVolumeMounts(ctx context.Context, sandbox string, ms []store.VolumeMount) error
	VolumeMountsOf(ctx context.Context, ids ...string) ([]store.VolumeMount, error)
	VolumeUsers(ctx context.Context, id string) ([]string, error)
}

var _ Store = (*store.Store)(nil)

const (
	// DefaultSize is a volume's limit when its create names none.
	DefaultSize int64 = 1 << 30
	// MaxSize bounds the limit a create may ask for (the image is sparse:
	// only what is written takes host disk).
	MaxSize int64 = 1 << 40
	// OwnerID is the uid and gid of a new volume's root and of what the
	// content API writes unless told: the templates' user.
	OwnerID = 1000
	// maxName bounds a volume's name.
	maxName = 255
	// tokenLifetime is how long a content API token is valid.
	tokenLifetime = 24 * time.Hour
	// maxMounts bounds the volumes one sandbox mounts.
	maxMounts = 16
)

var validName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// Options configure a Service.
type Options struct {
	// Dir holds the volumes' images, mounts and token key. Required.
	Dir string
	// Store records the volumes. Required.
	Store Store
	// DefaultSize is the limit of a volume whose create names none; zero
	// means DefaultSize.
	DefaultSize int64
	// Logger; nil discards.
	Logger *slog.Logger
	// Now; nil means time.Now.
	Now func() time.Time
}

// Service keeps the volumes.
type Service struct {
	st      Store
	dir     string
	fs      *quota.FS
	key     []byte // signs content API tokens
	defSize int64
	log     *slog.Logger
	now     func() time.Time
	// use is held shared by each create that mounts volumes until its
	// mounts are recorded, and exclusively by Delete's check and removal.
	use sync.RWMutex
	// createMu makes a create's check of the host's room and its image
	// one step.
	createMu sync.Mutex
}

// Open opens the volumes under opts.Dir and reconciles them with the
// store: a filesystem no record names (a create or delete cut short) is
// removed, a recorded volume whose mount went is mounted again.
func Open(ctx context.Context, opts Options) (*Service, error) {
	if opts.Dir == "" || opts.Store == nil {
		return nil, fmt.Errorf("volume: Dir and Store are required: %w", api.ErrInvalidArgument)
	}
	s := &Service{st: opts.Store, dir: opts.Dir, defSize: opts.DefaultSize, log: opts.Logger, now: opts.Now}
	if s.defSize == 0 {
		s.defSize = DefaultSize
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if err := os.Chmod(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	var err error
	if s.key, err = loadKey(filepath.Join(opts.Dir, "token.key")); err != nil {
		return nil, err
	}
	s.fs, err = quota.Open(ctx, quota.Options{ImageDir: filepath.Join(opts.Dir, "images"),
		MountDir: filepath.Join(opts.Dir, "mnt"), Logger: s.log, Durable: true})
	if err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if err := s.reconcile(ctx); err != nil {
		s.fs.Close()
		return nil, err
	}
	return s, nil
}

// Close unmounts the volumes (a busy one lazily: a sandbox left running
// keeps its mount) and releases the Service; the next Open mounts them
// again. After a crash they stay mounted, and Open uses those mounts.
func (s *Service) Close() error {
	var errs []error
	if dirs, err := s.fs.Dirs(); err != nil {
		errs = append(errs, err)
	} else {
		for _, d := range dirs {
			errs = append(errs, s.fs.Unmount(d))
		}
	}
	errs = append(errs, s.fs.Close())
	return errors.Join(errs...)
}

func (s *Service) reconcile(ctx context.Context) error {
	vols, err := s.st.Volumes(ctx, "")
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, v := range vols {
		known[v.ID] = true
		if _, err := s.fs.Remount(v.ID); err != nil {
			s.log.ErrorContext(ctx, "mounting a volume", "volume_id", v.ID, "err", err)
		}
	}
	dirs, err := s.fs.Dirs()
	if err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	for _, d := range dirs {
		if known[d] {
			continue
		}
		s.log.InfoContext(ctx, "removing a volume's leftovers", "volume_id", d)
		if err := s.fs.RemoveDir(d); err != nil {
			s.log.WarnContext(ctx, "removing a volume's leftovers", "volume_id", d, "err", err)
		}
	}
	return nil
}

// loadKey reads the token key at p, making it (0600) if missing.
func loadKey(p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("volume token key: %w", err)
	}
	b = make([]byte, 32)
	rand.Read(b)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, fmt.Errorf("volume token key: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return nil, fmt.Errorf("volume token key: %w", err)
	}
	return b, nil
}

// Info is a volume with a new content API token.
type Info struct {
	store.Volume
	Token string
}

// CheckName checks a volume name as E2B does.
func CheckName(name string) error {
	if !validName.MatchString(name) || len(name) > maxName {
		//lint:ignore ST1005 E2B's wording of the error
		return fmt.Errorf("Invalid volume name: %w", api.ErrInvalidArgument)
	}
	return nil
}

// Create makes team's volume name of size bytes (0: the default).
func (s *Service) Create(ctx context.Context, team, name string, size int64) (*Info, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if size == 0 {
		size = s.defSize
	}
	if size < quota.MinLimit || size > MaxSize {
		return nil, fmt.Errorf("volume size must be between %d and %d MiB: %w", quota.MinLimit>>20, MaxSize>>20, api.ErrInvalidArgument)
	}
	if _, err := s.st.VolumeByName(ctx, team, name); err == nil {
		//lint:ignore ST1005 E2B's wording of the error
		return nil, fmt.Errorf("Volume with name '%s' already exists: %w", name, api.ErrInvalidArgument)
	} else if !errors.Is(err, store.ErrVolumeNotFound) {
		return nil, err
	}
	// The check of the host's room and the new image are one step: two
	// creates cannot both count the same free space.
	s.createMu.Lock()
	defer s.createMu.Unlock()
	if err := s.checkRoom(ctx, size); err != nil {
		return nil, err
	}
	v := store.Volume{ID: newUUID(), Team: team, Name: name, SizeBytes: size, CreatedAt: s.now()}
	mnt, err := s.fs.NewDir(ctx, v.ID, size)
	if err != nil {
		return nil, fmt.Errorf("creating volume %s: %w", name, err)
	}
	if err := prepareRoot(mnt); err != nil {
		s.fs.RemoveDir(v.ID)
		return nil, fmt.Errorf("creating volume %s: %w", name, err)
	}
	if err := s.st.InsertVolume(context.WithoutCancel(ctx), &v); err != nil {
		s.fs.RemoveDir(v.ID)
		if errors.Is(err, store.ErrVolumeExists) {
			//lint:ignore ST1005 E2B's wording of the error
			return nil, fmt.Errorf("Volume with name '%s' already exists: %w", name, api.ErrInvalidArgument)
		}
		return nil, err
	}
	return &Info{Volume: v, Token: s.token(v)}, nil
}

// checkRoom refuses a volume of size bytes unless the host's filesystem
// under Dir has room for it besides what the existing volumes may still
// grow by: the images are sparse, and filling every volume to its size
// must never fill the host's disk.
func (s *Service) checkRoom(ctx context.Context, size int64) error {
	vols, err := s.st.Volumes(ctx, "")
	if err != nil {
		return err
	}
	var owed int64
	for _, v := range vols {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(s.dir, "images", v.ID+".img"), &st); err == nil {
			owed += max(v.SizeBytes-st.Blocks*512, 0)
		} else {
			owed += v.SizeBytes
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(s.dir, &fs); err != nil {
		return fmt.Errorf("volumes: %w", err)
	}
	free := int64(fs.Bavail) * fs.Bsize
	if owed+size > free {
		return fmt.Errorf("not enough disk on this host for a volume of %d MiB: %d MiB free, %d MiB of it promised to the existing volumes: %w",
			size>>20, free>>20, owed>>20, ErrFull)
	}
	return nil
}

// prepareRoot gives a new volume's root to the templates' user and syncs
// it: the volume exists whole before its record does.
func prepareRoot(mnt string) error {
	if err := os.Chown(mnt, OwnerID, OwnerID); err != nil {
		return err
	}
	if err := os.Chmod(mnt, 0o755); err != nil {
		return err
	}
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// List returns team's volumes.
func (s *Service) List(ctx context.Context, team string) ([]store.Volume, error) {
	return s.st.Volumes(ctx, team)
}

// Get returns team's volume id with a new token; a malformed id wraps
// api.ErrInvalidArgument, another team's is a missing one.
func (s *Service) Get(ctx context.Context, team, id string) (*Info, error) {
	v, err := s.byID(ctx, team, id)
	if err != nil {
		return nil, err
	}
	return &Info{Volume: v, Token: s.token(v)}, nil
}

func (s *Service) byID(ctx context.Context, team, id string) (store.Volume, error) {
	if !isUUID(id) {
		//lint:ignore ST1005 E2B's wording of the error
		return store.Volume{}, fmt.Errorf("Invalid volume ID: %w", api.ErrInvalidArgument)
	}
	v, err := s.st.VolumeByID(ctx, team, id)
	if errors.Is(err, store.ErrVolumeNotFound) {
		//lint:ignore ST1005 E2B's wording of the error
		return v, fmt.Errorf("Volume '%s' not found: %w", id, api.ErrNotFound)
	}
	return v, err
}

// Delete removes team's volume id and its content, unless a running or
// paused sandbox mounts it (api.ErrConflict).
func (s *Service) Delete(ctx context.Context, team, id string) error {
	v, err := s.byID(ctx, team, id)
	if err != nil {
		return err
	}
	s.use.Lock()
	defer s.use.Unlock()
	users, err := s.st.VolumeUsers(ctx, v.ID)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		//lint:ignore ST1005 E2B's wording of the error
		return fmt.Errorf("Volume '%s' is in use by sandbox %s: kill it first: %w", v.Name, strings.Join(users, ", "), api.ErrConflict)
	}
	if err := s.st.DeleteVolume(context.WithoutCancel(ctx), team, v.ID); err != nil {
		if errors.Is(err, store.ErrVolumeNotFound) {
			//lint:ignore ST1005 E2B's wording of the error
			return fmt.Errorf("Volume '%s' not found: %w", id, api.ErrNotFound)
		}
		return err
	}
	if err := s.fs.RemoveDir(v.ID); err != nil {
		// The record is gone: the next start removes what is left.
		s.log.WarnContext(ctx, "removing a deleted volume's filesystem", "volume_id", v.ID, "err", err)
	}
	return nil
}

// Mounts are the volumes a create mounts, resolved and held: Binds go in
// the sandbox's spec; Record (once the sandbox exists) or Release ends
// the hold, so a volume cannot be deleted between its check and its mount.
type Mounts struct {
	s      *Service
	Binds  []isolation.Bind
	mounts []store.VolumeMount
	once   sync.Once
}

// Resolve checks a create's volumeMounts as E2B does (each volume exists
// in team, each path is absolute and clean, no path repeats) and holds
// the volumes until Record or Release. Its error lists every bad mount.
func (s *Service) Resolve(ctx context.Context, team string, ms []api.VolumeMount) (*Mounts, error) {
	if len(ms) > maxMounts {
		return nil, fmt.Errorf("invalid mounts: at most %d volume mounts: %w", maxMounts, api.ErrInvalidArgument)
	}
	var bad []string
	seen := map[string]bool{}
	out := &Mounts{s: s}
	for i, m := range ms {
		switch {
		case m.Path == "":
			bad = append(bad, fmt.Sprintf("volume mount #%d: path is required", i))
			continue
		case !path.IsAbs(m.Path):
			bad = append(bad, fmt.Sprintf("volume mount #%d: path '%s' must be absolute", i, m.Path))
			continue
		case path.Clean(m.Path) != m.Path || strings.ContainsRune(m.Path, 0):
			bad = append(bad, fmt.Sprintf("volume mount #%d: path '%s' must be clean", i, m.Path))
			continue
		case m.Path == "/":
			bad = append(bad, fmt.Sprintf("volume mount #%d: path '/' would cover the sandbox's root", i))
			continue
		case reserved(m.Path):
			bad = append(bad, fmt.Sprintf("volume mount #%d: path '%s' is reserved", i, m.Path))
			continue
		case seen[m.Path]:
			bad = append(bad, fmt.Sprintf("volume mount #%d: path '%s' is used more than once", i, m.Path))
			continue
		}
		seen[m.Path] = true
		v, err := s.st.VolumeByName(ctx, team, m.Name)
		if errors.Is(err, store.ErrVolumeNotFound) {
			bad = append(bad, fmt.Sprintf("volume mount #%d: volume '%s' not found", i, m.Name))
			continue
		}
		if err != nil {
			return nil, err
		}
		out.Binds = append(out.Binds, isolation.Bind{HostPath: s.fs.Path(v.ID), Path: m.Path, Volume: v.ID})
		out.mounts = append(out.mounts, store.VolumeMount{VolumeID: v.ID, Name: v.Name, Path: m.Path})
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("invalid mounts:\n\t- %s: %w", strings.Join(bad, "\n\t- "), api.ErrInvalidArgument)
	}
	s.use.RLock()
	// A volume deleted between its lookup and the hold is missing now.
	for _, m := range out.mounts {
		if _, err := s.st.VolumeByID(ctx, team, m.VolumeID); err != nil {
			s.use.RUnlock()
			if errors.Is(err, store.ErrVolumeNotFound) {
				return nil, fmt.Errorf("invalid mounts:\n\t- volume '%s' not found: %w", m.Name, api.ErrInvalidArgument)
			}
			return nil, err
		}
	}
	return out, nil
}

// reserved reports a path a volume may not cover: the sandbox's kernel
// interfaces and fence's own directory.
func reserved(p string) bool {
	for _, r := range []string{"/proc", "/sys", "/dev", "/.fence"} {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// Record records that sandbox mounts the volumes and ends the hold.
func (m *Mounts) Record(ctx context.Context, sandbox string) error {
	defer m.Release()
	return m.s.st.InsertVolumeMounts(context.WithoutCancel(ctx), sandbox, m.mounts)
}

// Release ends the hold (idempotent).
func (m *Mounts) Release() {
	m.once.Do(m.s.use.RUnlock)
}

// Inherit records that child (a fork of parent) mounts parent's volumes
// at the same paths.
func (s *Service) Inherit(ctx context.Context, parent, child string) error {
	ms, err := s.st.VolumeMountsOf(ctx, parent)
	if err != nil || len(ms) == 0 {
		return err
	}
	return s.st.InsertVolumeMounts(context.WithoutCancel(ctx), child, ms)
}

// MountsOf returns the volumes each of the sandboxes ids mounts, by
// sandbox.
func (s *Service) MountsOf(ctx context.Context, ids ...string) (map[string][]api.VolumeMount, error) {
	ms, err := s.st.VolumeMountsOf(ctx, ids...)
	if err != nil {
		return nil, err
	}
	out := map[string][]api.VolumeMount{}
	for _, m := range ms {
		out[m.SandboxID] = append(out[m.SandboxID], api.VolumeMount{Name: m.Name, Path: m.Path})
	}
	return out, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// isUUID reports whether id is a UUID in its 36-character lower-case form.
func isUUID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i, c := range id {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}
