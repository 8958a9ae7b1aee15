package sandbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/fake"
	"github.com/fencesandbox/fence/internal/tenancy"
)

func quotaEnv(t *testing.T, l tenancy.Limits, opts ...envOpt) (*env, *tenancy.Quotas) {
	t.Helper()
	q, err := tenancy.NewQuotas(nil, tenancy.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Set(t.Context(), "a", l); err != nil {
		t.Fatal(err)
	}
	return newEnv(t, append([]envOpt{func(o *Options) { o.Quota = q }}, opts...)...), q
}

func as(ctx context.Context, team string) context.Context {
	return tenancy.NewContext(ctx, tenancy.Principal{Team: team, KeyID: "k"})
}

// 50 concurrent creates of a team against its limit of 10 leave exactly
// 10 sandboxes; another team is not limited by it.
func TestTeamQuotaConcurrentCreates(t *testing.T) {
	e, q := quotaEnv(t, tenancy.Limits{ConcurrentSandboxes: 10})
	var wg sync.WaitGroup
	var ok, refused atomic.Int32
	for range 50 {
		wg.Go(func() {
			_, err := e.m.Create(as(t.Context(), "a"), CreateRequest{TemplateID: "base"})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, api.ErrResourceExhausted):
				refused.Add(1)
			default:
				t.Errorf("Create() = %v", err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 10 || refused.Load() != 40 || len(e.host.Running()) != 10 {
		t.Fatalf("created %d, refused %d, backend runs %d; want 10, 40, 10", ok.Load(), refused.Load(), len(e.host.Running()))
	}
	if u := q.Usage("a"); u.Running != 10 {
		t.Fatalf("usage %+v", u)
	}
	if _, err := e.m.Create(as(t.Context(), "b"), CreateRequest{TemplateID: "base"}); err != nil {
		t.Fatalf("another team's create: %v", err)
	}
}

// A paused sandbox leaves the running count; its resume is refused while
// the team is at its running limit; a kill gives its room back.
func TestTeamQuotaPauseResumeKill(t *testing.T) {
	e, q := quotaEnv(t, tenancy.Limits{ConcurrentSandboxes: 1, PausedSandboxes: 1})
	ctx := as(t.Context(), "a")
	s, err := e.m.Create(ctx, CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "base"}); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("create over the limit: %v", err)
	}
	if err := e.m.Pauses().Pause(ctx, s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	s2, err := e.m.Create(ctx, CreateRequest{TemplateID: "base"})
	if err != nil {
		t.Fatalf("create beside a paused sandbox: %v", err)
	}
	if err := e.m.Pauses().Pause(ctx, s2.ID, WithMemory); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("pause over the paused limit: %v", err)
	}
	if got, _ := e.m.Get(ctx, s2.ID); got.State != StateRunning {
		t.Fatalf("a refused pause left %s", got.State)
	}
	if _, err := e.m.Pauses().Resume(ctx, s.ID, time.Minute, nil, WithMemory); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("resume at the running limit: %v", err)
	}
	if got, _ := e.m.Get(ctx, s.ID); got.State != StatePaused {
		t.Fatalf("a refused resume left %s", got.State)
	}
	if err := e.m.Kill(ctx, s2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pauses().Resume(ctx, s.ID, time.Minute, nil, WithMemory); err != nil {
		t.Fatalf("resume under the limit: %v", err)
	}
	if u := q.Usage("a"); u != (tenancy.Usage{Running: 1, CPUs: s.CPUs, MemoryMB: s.MemoryMB}) {
		t.Fatalf("usage %+v", u)
	}
	if err := e.m.Kill(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if u := q.Usage("a"); u != (tenancy.Usage{}) {
		t.Fatalf("usage after the kills %+v", u)
	}
}

// A create that fails, or that asks more than the team may have, leaves
// the team's count as it was.
func TestTeamQuotaFailedCreateGivesBack(t *testing.T) {
	boom := errors.New("boom")
	e, q := quotaEnv(t, tenancy.Limits{ConcurrentSandboxes: 1, VCPUs: 1}, func(o *Options) {
		o.Backend = fake.New(fake.Options{CreateHook: func(context.Context, isolation.Spec) error { return boom }})
	})
	ctx := as(t.Context(), "a")
	if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "base"}); !errors.Is(err, boom) {
		t.Fatalf("Create() = %v, want boom", err)
	}
	if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "base", CPUs: 2}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("Create(2 vCPUs) = %v, want invalid argument", err)
	}
	if u := q.Usage("a"); u != (tenancy.Usage{}) {
		t.Fatalf("usage %+v", u)
	}
}

// A team's maximum lifetime bounds the timeout at create, at a resume and
// when it is set; a template build's sandboxes are not the team's.
func TestTeamQuotaLifetimeAndBuilds(t *testing.T) {
	e, q := quotaEnv(t, tenancy.Limits{ConcurrentSandboxes: 1, MaxLifetimeSeconds: 60})
	ctx := as(t.Context(), "a")
	if _, err := e.m.Create(ctx, CreateRequest{TemplateID: "base", Timeout: time.Hour}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("Create(1h) = %v, want invalid argument", err)
	}
	s, err := e.m.Create(ctx, CreateRequest{TemplateID: "base", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.SetTimeout(ctx, s.ID, time.Hour); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("SetTimeout(1h) = %v, want invalid argument", err)
	}
	if err := e.m.Pauses().Pause(ctx, s.ID, WithMemory); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Pauses().Resume(ctx, s.ID, time.Hour, nil, WithMemory); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("Resume(1h) = %v, want invalid argument", err)
	}
	if _, err := e.m.Pauses().Resume(ctx, s.ID, time.Minute, nil, WithMemory); err != nil {
		t.Fatal(err)
	}
	b, err := e.m.Create(ctx, CreateRequest{TemplateID: "base", Timeout: time.Hour, Metadata: map[string]string{BuildMetadataKey: "b1"}})
	if err != nil {
		t.Fatalf("a build's sandbox: %v", err)
	}
	if u := q.Usage("a"); u.Running != 1 {
		t.Fatalf("usage %+v: the build's sandbox counted", u)
	}
	if err := e.m.Kill(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if u := q.Usage("a"); u.Running != 1 {
		t.Fatalf("usage %+v after the build's kill", u)
	}
}
