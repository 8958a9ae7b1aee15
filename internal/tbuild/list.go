package tbuild

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tbuild/names"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Listed is one template in a list (E2B's Template).
type Listed struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    int        `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	BuildStatus   Status     `json:"buildStatus"`
	CreatedBy     *struct{}  `json:"createdBy"`
	EnvdVersion   string     `json:"envdVersion"`
	// Team owns the template (not shown: a team lists its own alone).
	Team string `json:"-"`
}

// EnvdVersion is the envd version fence's agent reports.
const EnvdVersion = "0.2.0"

// List returns the templates, newest first. With a cluster's index, the
// templates it holds are listed as it holds them, and of this node's own
// only those it has not got (builds not finished, or made before the
// node had a registry).
func (s *Service) List() []Listed {
	out := []Listed{}
	inIndex := map[string]bool{}
	if s.shares() {
		ctx, cancel := indexCtx()
		recs, err := s.opts.Shared.SharedTemplates(ctx)
		cancel()
		if err != nil {
			s.log.Warn("listing the cluster's templates; listing this node's", "err", err)
		}
		for _, rec := range recs {
			if l, ok := s.listed(rec); ok {
				out = append(out, l)
				inIndex[rec.ID] = true
			}
		}
	}
	fromIndex := map[string]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.builds {
		if b.ContentDigest != "" {
			fromIndex[b.TemplateID] = true
		}
	}
	for _, t := range s.names.All() {
		if inIndex[t.ID] || fromIndex[t.ID] {
			continue // the cluster's answer, or deleted in the cluster
		}
		l := Listed{TemplateID: t.ID, BuildID: "00000000-0000-0000-0000-000000000000", CPUCount: 2, MemoryMB: 1024,
			Public: t.Public, Aliases: []string{t.Alias}, Names: s.names.Names(t.Alias),
			CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, BuildStatus: StatusWaiting, EnvdVersion: EnvdVersion,
			Team: tenancy.Owner(t.Team)}
		var latest *Build
		for _, b := range s.builds {
			if b.TemplateID != t.ID {
				continue
			}
			l.BuildCount++
			if latest == nil || b.CreatedAt.After(latest.CreatedAt) {
				latest = b
			}
		}
		if latest != nil {
			l.BuildStatus = latest.Status
		}
		if r, ok := t.Tags[names.DefaultTag]; ok {
			if b := s.builds[r.BuildID]; b != nil {
				l.BuildID, l.CPUCount, l.MemoryMB = b.ID, b.CPUs, b.MemoryMB
			}
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Listed) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out
}

// BuildSummary is one build in a template's detail.
type BuildSummary struct {
	BuildID     string     `json:"buildID"`
	Status      Status     `json:"status"`
	CreatedAt   time.Time  `json:"createdAt"`
	UpdatedAt   time.Time  `json:"updatedAt"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	CPUCount    int        `json:"cpuCount"`
	MemoryMB    int        `json:"memoryMB"`
	EnvdVersion string     `json:"envdVersion,omitempty"`
}

// Detail is E2B's TemplateWithBuilds.
type Detail struct {
	TemplateID    string         `json:"templateID"`
	Public        bool           `json:"public"`
	Aliases       []string       `json:"aliases"`
	Names         []string       `json:"names"`
	CreatedAt     time.Time      `json:"createdAt"`
	UpdatedAt     time.Time      `json:"updatedAt"`
	LastSpawnedAt *time.Time     `json:"lastSpawnedAt"`
	SpawnCount    int64          `json:"spawnCount"`
	Builds        []BuildSummary `json:"builds"`
}

// Get returns a template's detail, builds newest first. A template of
// the cluster's index is answered as the index holds it: its newest
// build.
func (s *Service) Get(id string) (*Detail, error) {
	ctx, cancel := indexCtx()
	rec, err := s.indexed(ctx, id)
	cancel()
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.ID == id {
		l, ok := s.listed(*rec)
		if !ok {
			return nil, fmt.Errorf("template %q: its record in the cluster's index is corrupt", id)
		}
		var meta sharedMeta
		_ = json.Unmarshal(rec.Meta, &meta)
		b := meta.Build
		return &Detail{TemplateID: l.TemplateID, Public: l.Public, Aliases: l.Aliases, Names: l.Names,
			CreatedAt: l.CreatedAt, UpdatedAt: l.UpdatedAt, Builds: []BuildSummary{{BuildID: b.ID, Status: StatusReady,
				CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt, FinishedAt: b.FinishedAt, CPUCount: b.CPUs, MemoryMB: b.MemoryMB,
				EnvdVersion: EnvdVersion}}}, nil
	}
	t, ok := s.names.Get(id)
	if !ok || (s.shares() && s.fromIndex(t.ID)) {
		return nil, fmt.Errorf("template %q not found: %w", id, api.ErrNotFound)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d := &Detail{TemplateID: t.ID, Public: t.Public, Aliases: []string{t.Alias}, Names: s.names.Names(t.Alias),
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, Builds: []BuildSummary{}}
	for _, b := range s.builds {
		if b.TemplateID == t.ID {
			d.Builds = append(d.Builds, BuildSummary{BuildID: b.ID, Status: b.Status, CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt,
				FinishedAt: b.FinishedAt, CPUCount: b.CPUs, MemoryMB: b.MemoryMB, EnvdVersion: EnvdVersion})
		}
	}
	slices.SortFunc(d.Builds, func(a, b BuildSummary) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return d, nil
}
