package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/fencesandbox/fence/internal/egress"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/gvisor"
	"github.com/fencesandbox/fence/internal/isolation/multi"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/netfence"
)

// Backend names.
const (
	BackendNative = "native"
	BackendGvisor = "gvisor"
)

// withGvisor returns the daemon's backend: native alone, or native and
// gvisor behind a router whose default is opts.Backend. The gvisor backend
// gets the same CA as native; the network fence of both is the sandbox
// manager's (fenceConfig). Without runsc, gvisor is left out, unless it is
// the default, which is then an error.
func withGvisor(ctx context.Context, opts Config, nat *native.Backend, caPEM []byte, log *slog.Logger) (isolation.Backend, func(), error) {
	switch opts.Backend {
	case "", BackendNative, BackendGvisor:
	default:
		return nil, nil, fmt.Errorf("unknown backend %q (native or gvisor)", opts.Backend)
	}
	gvOpts := gvisor.Options{
		StateDir:   filepath.Join(opts.DataDir, "gvisor"),
		Runsc:      opts.Runsc,
		Executable: opts.Executable,
		Defaults:   opts.Defaults.Limits(),
		TrustedCA:  caPEM,
		Logger:     log,
	}
	gv, err := gvisor.New(ctx, gvOpts)
	if err == nil {
		if err := gvisor.CleanupStale(ctx, gvOpts); err != nil {
			log.Warn("cleaning up after earlier gvisor instances", "err", err)
		}
	}
	if err != nil {
		if opts.Backend == BackendGvisor {
			return nil, nil, fmt.Errorf("starting gvisor backend: %w", err)
		}
		if !errors.Is(err, gvisor.ErrNoRunsc) {
			log.Warn("gvisor backend unavailable", "err", err)
		} else {
			log.Info("gvisor backend unavailable: no runsc", "err", err)
		}
		return nat, func() {}, nil
	}
	def, other := isolation.Backend(nat), isolation.Backend(gv)
	if opts.Backend == BackendGvisor {
		def, other = gv, nat
	}
	r, err := multi.New(def, other)
	if err != nil {
		gv.Close()
		return nil, nil, err
	}
	return r, func() { gv.Close() }, nil
}

// fenceConfig is the sandboxes' network fence, which the sandboxes'
// network side owns (fences.Options.Fence, with the egress gateway in
// fences.Options.Gateway): resolver, host addresses, flow recorder, shared
// stack budget and bandwidth, the same on every backend. The Set
// counts each flow's bytes in the sandbox's usage before the recorder
// gets it (fences.Core.AddEgress).
func fenceConfig(opts Config, rec egress.Recorder, net *egress.Shared, hostAddrs []netip.Addr, log *slog.Logger) netfence.Fence {
	return netfence.Fence{
		DNSUpstream: opts.DNSUpstream,
		HostAddrs:   hostAddrs,
		Bandwidth:   opts.NetBandwidth,
		Recorder:    rec,
		Net:         net,
		Logger:      log,
	}
}
