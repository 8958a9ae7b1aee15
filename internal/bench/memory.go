package bench

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/warm"
)

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// fenceWarm measures create → exec → kill when the create is served by a
// warm pool (the pool refills between iterations, outside the timing).
func fenceWarm(ctx context.Context, opts Options) Result {
	name := "fence create→exec true→kill, warm pool"
	pool := warm.New(warm.Options{Backend: opts.Backend, Size: 1})
	defer pool.Close(context.WithoutCancel(ctx))
	pool.Start(warm.Target{RootFS: opts.RootFS}, nil)
	r := Result{Name: name}
	for i := -1; i < opts.Iterations; i++ { // -1: warm-up
		if err := pool.WaitReady(ctx); err != nil {
			r.Err = err
			return r
		}
		start := time.Now()
		sb, err := pool.Create(ctx, isolation.Spec{RootFS: opts.RootFS})
		if err == nil {
			err = execTrue(ctx, processClient(sb))
			if kerr := sb.Kill(context.WithoutCancel(ctx)); err == nil {
				err = kerr
			}
		}
		if err != nil {
			r.Err = err
			return r
		}
		if i >= 0 {
			r.Samples = append(r.Samples, time.Since(start))
		}
	}
	return r
}

// idleMemory creates opts.Idle sandboxes, lets them settle and returns the
// mean memory charged to their cgroups and the mean growth of this
// process's resident memory per sandbox.
func idleMemory(ctx context.Context, opts Options) (int64, int64, error) {
	runtime.GC()
	before := rss()
	// An agent's start-up memory may be charged to where its process
	// waited before its sandbox existed (the native backend's ready
	// inits): counted here too.
	ready, _ := isolation.As[interface{ ReadyMemory() int64 }](opts.Backend)
	var readyBefore int64
	if ready != nil {
		readyBefore = ready.ReadyMemory()
	}
	var sbs []isolation.Sandbox
	defer func() {
		for _, sb := range sbs {
			sb.Kill(context.WithoutCancel(ctx))
		}
	}()
	for range opts.Idle {
		sb, err := opts.Backend.Create(ctx, isolation.Spec{ID: newID("benchidle"), RootFS: opts.RootFS})
		if err != nil {
			return 0, 0, err
		}
		sbs = append(sbs, sb)
	}
	// Let the agents finish starting before reading their charge.
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	runtime.GC()
	daemon := (rss() - before) / int64(len(sbs))
	var total int64
	for _, sb := range sbs {
		st, err := sb.Stats(ctx)
		if err != nil {
			return 0, 0, err
		}
		total += st.MemoryBytes
	}
	if ready != nil {
		total += max(ready.ReadyMemory()-readyBefore, 0)
	}
	return total / int64(len(sbs)), max(daemon, 0), nil
}

// rss returns this process's resident set size in bytes.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}
