package tbuild

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/oci"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tbuild/content"
	"github.com/fencesandbox/fence/internal/tbuild/names"
	"github.com/fencesandbox/fence/internal/template"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Status is a build's state.
type Status string

// Build states, E2B's.
const (
	StatusWaiting  Status = "waiting"
	StatusBuilding Status = "building"
	StatusReady    Status = "ready"
	StatusError    Status = "error"
)

// LogEntry is one line of a build's log.
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"` // debug, info, warn, error
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// Reason says why a build failed.
type Reason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []LogEntry `json:"logEntries,omitempty"`
}

// Step is one build step as the SDKs send it.
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force"`
}

// RegistryConfig is fromImageRegistry: credentials for the image's
// registry. It is never stored.
type RegistryConfig struct {
	Type               string `json:"type"`
	Username           string `json:"username,omitempty"`
	Password           string `json:"password,omitempty"`
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSRegion          string `json:"awsRegion,omitempty"`
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
}

// Spec is the body of a build trigger (E2B's TemplateBuildStartV2).
type Spec struct {
	FromImage         string          `json:"fromImage,omitempty"`
	FromTemplate      string          `json:"fromTemplate,omitempty"`
	FromImageRegistry *RegistryConfig `json:"fromImageRegistry,omitempty"`
	Steps             []Step          `json:"steps,omitempty"`
	StartCmd          string          `json:"startCmd,omitempty"`
	ReadyCmd          string          `json:"readyCmd,omitempty"`
	Force             bool            `json:"force,omitempty"`
}

// Runtime is what a template's build leaves for its sandboxes.
type Runtime struct {
	User     string `json:"user,omitempty"`
	Workdir  string `json:"workdir,omitempty"`
	StartCmd string `json:"startCmd,omitempty"`
	ReadyCmd string `json:"readyCmd,omitempty"`
	// CPUs and MemoryMB are the build request's, its sandboxes' size.
	CPUs     int `json:"cpuCount,omitempty"`
	MemoryMB int `json:"memoryMB,omitempty"`
}

// Build is one build of a template.
type Build struct {
	ID         string     `json:"id"`
	TemplateID string     `json:"templateID"`
	Status     Status     `json:"status"`
	CreatedAt  time.Time  `json:"createdAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	CPUs       int        `json:"cpuCount"`
	MemoryMB   int        `json:"memoryMB"`
	Tags       []string   `json:"tags"`
	Spec       *Spec      `json:"spec,omitempty"` // without credentials
	Reason     *Reason    `json:"reason,omitempty"`
	Logs       []LogEntry `json:"logs,omitempty"`
	Tree       string     `json:"tree,omitempty"` // layer tree of a ready build
	// Layers are the trees the build went through (its cached chain),
	// kept while the record exists.
	Layers      []string `json:"layers,omitempty"`
	Runtime     Runtime  `json:"runtime"`
	ImageDigest string   `json:"imageDigest,omitempty"`
	// ContentDigest is the digest of the build's image in the cluster's
	// content registry (pushed by this node or pulled from it).
	ContentDigest string `json:"contentDigest,omitempty"`
}

// DocStore persists the records; *store.Store implements it.
type DocStore interface {
	PutTemplateDoc(ctx context.Context, d store.Doc) error
	PutBuildDoc(ctx context.Context, d store.Doc) error
	DeleteTemplateDoc(ctx context.Context, id string) error
	TemplateDocs(ctx context.Context) ([]store.Doc, error)
	BuildDocs(ctx context.Context) ([]store.Doc, error)
}

// BoxSpec is what a build asks of a build sandbox: a sandbox of the
// template Template (a handle the Catalog resolves to a layer tree), on the
// backend Backend, marked as a sandbox of build BuildID, with these limits
// and this network (AllowInternet false: Network's allowlist only).
type BoxSpec struct {
	Template      string
	BuildID       string
	Backend       string
	Timeout       time.Duration
	CPUs          float64
	MemoryMB      int64
	AllowInternet bool
	Network       *api.NetworkConfig
}

// LiveSandbox is a sandbox, running or paused, as the builds see it: the
// template name its create gave.
type LiveSandbox struct {
	Template string
	Paused   bool
}

// Sandboxes makes the build sandboxes and tells which sandboxes live; the
// daemon implements it over the sandbox manager and gives it to the
// Runner (NewRunner).
type Sandboxes interface {
	// CreateBox creates a sandbox and returns its ID and the backend's
	// handle of it.
	CreateBox(ctx context.Context, spec BoxSpec) (id string, box isolation.Sandbox, err error)
	Kill(ctx context.Context, id string) error
	// Live lists the sandboxes running or paused.
	Live(ctx context.Context) ([]LiveSandbox, error)
	// CreatesInFlight counts the creates not recorded yet.
	CreatesInFlight() int
}

// BuildAdmitter is implemented by Sandboxes that limit the builds a team
// runs at once: AdmitBuild takes room for one build acting for ctx's
// principal, or refuses (nothing of the build changes); release gives it
// back when the build ends.
type BuildAdmitter interface {
	AdmitBuild(ctx context.Context) (release func(), err error)
}

// Parents are the templates fence builds itself (minimal, base, …), the
// parents a build may start from and the rest of the Catalog;
// *template.Store implements it.
type Parents interface {
	Resolve(name string) (rootfs string, err error)
	ReadyPorts(name string) []uint16
	Info(name string) (template.Info, error)
}

// Images unpacks OCI images; *oci.Cache implements it.
type Images interface {
	Unpack(ctx context.Context, ref, dst string, opts oci.Options) (oci.Image, error)
}

// Options configure a Service.
type Options struct {
	// Dir holds the layer trees and uploaded files. Required.
	Dir     string
	Store   DocStore // required
	Parents Parents  // required
	// Images unpacks fromImage bases; nil fails such builds clearly.
	Images Images
	// Allow is the egress allowlist of build steps (allowOut entries:
	// names, presets, CIDRs); nil means DefaultAllow.
	Allow []string
	// PipIndex, when set, is the package index every build step's pip
	// uses (PIP_INDEX_URL, and PIP_TRUSTED_HOST for plain HTTP; a step's
	// own setEnvs value wins); its host and port join the allowlist.
	PipIndex *PipIndex
	// Namespace is the team slug names are shown under; empty "fence".
	Namespace string
	// MaxUploadBytes bounds one COPY archive; zero means 1 GiB.
	MaxUploadBytes int64
	// Registry and Shared, both set, move built templates between the
	// nodes of a cluster (shared.go); Node names this node in Shared's
	// records.
	Registry ContentRegistry
	Shared   SharedIndex
	Node     string
	Logger   *slog.Logger
	Now      func() time.Time
}

// DefaultAllow is the build steps' default egress: the package
// registries' presets.
var DefaultAllow = []string{"@pypi", "@npm", "@debian", "@go", "@crates", "@github"}

// Service keeps E2B's template records, their uploads and logs, and
// resolves their layers (Catalog); it needs no sandboxes, so the sandbox
// manager that resolves templates through it is made after it. Its
// Runner, made after the manager, runs the builds. It is safe for
// concurrent use.
type Service struct {
	opts Options
	log  *slog.Logger
	now  func() time.Time

	mu sync.Mutex
	// +checklocks:mu
	builds map[string]*Build
	// +checklocks:mu
	uploads map[string]*upload // token → link
	// +checklocks:mu
	running map[string]context.CancelFunc // build ID → cancel
	// +checklocks:mu
	layers map[string]string // handle → tree path, for build sandboxes
	// +checklocks:mu
	boxRuntimes map[string]Runtime // handle → start and ready commands of a finalize sandbox
	// +checklocks:mu
	creds map[string]*RegistryConfig // build ID → credentials, never stored
	// +checklocks:mu
	pulls map[string]*pullCall // image digest → its pull in progress
	// +checklocks:mu
	sandboxes Sandboxes // the Runner's, once there is one

	content *content.Store  // the trees, the layer cache, the COPY archives
	names   *names.Registry // the templates' names, tags and visibility

	gcMu sync.Mutex // one collection, or tombstone, at a time
	wg   sync.WaitGroup
	// +checklocks:mu
	archivesSwept time.Time // the last sweep of COPY archives (content.ArchiveSweepEvery)
}

// New opens the service: it reads the records, marks the builds that a
// stopped daemon left unfinished as failed and removes unfinished trees.
func New(ctx context.Context, opts Options) (*Service, error) {
	if opts.Dir == "" || opts.Store == nil || opts.Parents == nil {
		return nil, errors.New("tbuild: Dir, Store and Parents are required")
	}
	if opts.Allow == nil {
		opts.Allow = DefaultAllow
	}
	if err := CheckAllow(opts.Allow); err != nil {
		return nil, err
	}
	opts.Allow = slices.Clone(opts.Allow)
	if opts.PipIndex != nil {
		opts.Allow = append(opts.Allow, opts.PipIndex.allow())
	}
	if opts.Namespace == "" {
		opts.Namespace = "fence"
	}
	if opts.MaxUploadBytes == 0 {
		opts.MaxUploadBytes = 1 << 30
	}
	s := &Service{opts: opts, log: opts.Logger, now: opts.Now,
		builds: map[string]*Build{}, uploads: map[string]*upload{},
		running: map[string]context.CancelFunc{}, layers: map[string]string{}, creds: map[string]*RegistryConfig{},
		boxRuntimes: map[string]Runtime{}, pulls: map[string]*pullCall{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	c, err := content.Open(content.Options{Dir: opts.Dir, Logger: s.log, Now: s.now})
	if err != nil {
		return nil, err
	}
	s.content = c
	if s.names, err = names.Open(ctx, names.Options{Store: opts.Store, Namespace: opts.Namespace, Logger: s.log, Now: s.now}); err != nil {
		return nil, err
	}
	bdocs, err := opts.Store.BuildDocs(ctx)
	if err != nil {
		return nil, err
	}
	for _, d := range bdocs {
		var b Build
		if err := json.Unmarshal(d.JSON, &b); err != nil {
			s.log.Warn("skipping a corrupt build record", "id", d.ID, "err", err)
			continue
		}
		if b.Status == StatusWaiting || b.Status == StatusBuilding {
			b.Status = StatusError
			b.Reason = &Reason{Message: "the build was interrupted: the fence daemon stopped during it", Step: "base"}
			now := s.now().UTC()
			b.FinishedAt, b.UpdatedAt = &now, now
			b.Logs = append(b.Logs, LogEntry{Timestamp: now, Level: "error", Message: b.Reason.Message})
			s.builds[b.ID] = &b
			s.saveBuild(ctx, &b)
			continue
		}
		s.builds[b.ID] = &b
		if b.Status == StatusReady {
			s.names.Ready(b.TemplateID, b.ID)
		}
	}
	return s, nil
}

// Close cancels the builds in progress and waits for them to stop.
func (s *Service) Close() {
	s.mu.Lock()
	for _, c := range s.running {
		c()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.content.Close()
}

func newID(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (s *Service) saveBuild(ctx context.Context, b *Build) {
	s.mu.Lock()
	j, err := json.Marshal(b)
	id, tid, st := b.ID, b.TemplateID, b.Status
	s.mu.Unlock()
	if err == nil {
		err = s.opts.Store.PutBuildDoc(context.WithoutCancel(ctx), store.Doc{ID: id, Key: tid, Status: string(st), JSON: j})
	}
	if err != nil {
		s.log.Error("recording a build", "id", id, "err", err)
	}
}

// Registered is the answer to Register (E2B's TemplateRequestResponseV3).
type Registered struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Aliases    []string `json:"aliases"`
	Tags       []string `json:"tags"`
	Public     bool     `json:"public"`
}

// Register records a new build of the template called name (created if
// new), in state waiting.
func (s *Service) Register(ctx context.Context, name string, tags []string, cpus, memoryMB int) (*Registered, error) {
	if strings.TrimSpace(name) == "" {
		//lint:ignore ST1005 E2B's wording, which the e2b SDKs show as it is.
		return nil, fmt.Errorf("Name is required: %w", api.ErrInvalidArgument)
	}
	n, err := names.ParseName(name)
	if err != nil {
		return nil, err
	}
	if n.Namespace != "" && n.Namespace != s.names.Namespace() {
		return nil, fmt.Errorf("namespace %q is not this server's (%q): %w", n.Namespace, s.names.Namespace(), api.ErrInvalidArgument)
	}
	var all []string
	if n.Tag != "" {
		all = append(all, n.Tag)
	}
	for _, t := range tags {
		t, ok := names.CleanTag(t)
		if !ok {
			return nil, fmt.Errorf("invalid tag %q (want [a-z0-9_.-]+, not a UUID): %w", t, api.ErrInvalidArgument)
		}
		if !slices.Contains(all, t) {
			all = append(all, t)
		}
	}
	if len(all) == 0 {
		all = []string{names.DefaultTag}
	}
	if cpus == 0 {
		cpus = 2
	}
	if memoryMB == 0 {
		memoryMB = 1024
	}
	if cpus < 1 || cpus > 32 || (cpus != 1 && cpus%2 != 0) {
		return nil, fmt.Errorf("cpuCount %d: want 1 or an even number up to 32: %w", cpus, api.ErrInvalidArgument)
	}
	if memoryMB < 128 || memoryMB%2 != 0 {
		return nil, fmt.Errorf("memoryMB %d: want an even number of at least 128: %w", memoryMB, api.ErrInvalidArgument)
	}
	if err := s.adoptForBuild(ctx, n.Alias); err != nil {
		return nil, err
	}
	now := s.now().UTC()
	s.mu.Lock()
	// Claimed under s.mu: a deletion of the template takes its builds
	// with it, this one included.
	t, err := s.names.ClaimFor(n, tenancy.TeamOf(ctx))
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	b := &Build{ID: newUUID(), TemplateID: t.ID, Status: StatusWaiting, CreatedAt: now, UpdatedAt: now,
		CPUs: cpus, MemoryMB: memoryMB, Tags: all}
	var superseded []*Build
	for _, old := range s.builds {
		if old.TemplateID == t.ID && old.Status == StatusWaiting {
			old.Status, old.UpdatedAt = StatusError, now
			old.Reason = &Reason{Message: "The build was canceled because it was superseded by a newer one."}
			superseded = append(superseded, old)
		}
	}
	s.builds[b.ID] = b
	s.mu.Unlock()
	s.names.Save(ctx, t.ID)
	s.saveBuild(ctx, b)
	for _, old := range superseded {
		s.saveBuild(ctx, old)
	}
	return &Registered{TemplateID: t.ID, BuildID: b.ID, Names: s.names.Names(n.Alias),
		Aliases: []string{n.Alias}, Tags: all}, nil
}

// buildLocked finds a build of a template.
// +checklocks:s.mu
func (s *Service) buildLocked(templateID, buildID string) (*Build, error) {
	if !names.IsUUID(buildID) {
		return nil, fmt.Errorf("invalid build ID %q: %w", buildID, api.ErrInvalidArgument)
	}
	t, err := s.names.Lookup(templateID)
	if err != nil {
		return nil, err
	}
	b, ok := s.builds[buildID]
	if !ok || b.TemplateID != t.ID {
		return nil, fmt.Errorf("template %q has no build %q: %w", templateID, buildID, api.ErrNotFound)
	}
	return b, nil
}

// Delete removes a template (any tag in the name is ignored) and its
// builds' records, unless a live sandbox of the Runner's uses it.
func (r *Runner) Delete(ctx context.Context, idOrName string) error {
	s, sbs := r.Service, r.sandboxes
	t, err := s.names.Lookup(idOrName)
	local := err == nil
	if !local {
		// A template of the cluster this node never pulled.
		rec, ierr := s.indexed(ctx, idOrName)
		if ierr != nil || rec == nil {
			return cmpErr(ierr, err)
		}
		t = names.Template{ID: rec.ID, Alias: rec.Alias, Team: rec.Team}
	}
	if sbs != nil {
		live, err := sbs.Live(ctx)
		if err != nil {
			return err
		}
		for _, sb := range live {
			if !usesTemplate(sb.Template, t.ID, t.Alias) {
				continue
			}
			what := "running"
			if sb.Paused {
				what = "paused"
			}
			return fmt.Errorf("cannot delete template '%s' because there are %s sandboxes using it: %w", t.Alias, what, api.ErrInvalidArgument)
		}
	}
	// The cluster's record goes first: the other nodes drop their copies
	// at their next use of the template.
	if s.shares() {
		if err := s.opts.Shared.DeleteSharedTemplate(ctx, t.ID); err != nil {
			return err
		}
	}
	if !local {
		return nil
	}
	return s.removeLocal(ctx, t, sbs)
}

// SetPublic sets (when public is not nil) whether a template is public
// and returns its names.
func (s *Service) SetPublic(ctx context.Context, id string, public *bool) ([]string, error) {
	out, err := s.names.SetPublic(ctx, id, public)
	if public == nil || (err != nil && !errors.Is(err, api.ErrNotFound)) {
		return out, err
	}
	rec, ierr := s.indexed(ctx, id)
	if ierr != nil {
		return nil, ierr
	}
	if rec == nil {
		return out, err
	}
	if err := s.opts.Shared.SetSharedTemplatePublic(ctx, rec.ID, *public); err != nil {
		return nil, err
	}
	return s.names.Names(rec.Alias), nil
}
