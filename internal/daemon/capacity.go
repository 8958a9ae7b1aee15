package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/fencesandbox/fence/internal/capacity"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/metrics"
)

// capacitySource reads the host's limits for admission: the host's, the
// data dir's, and the pids.max of the native backend's cgroup parent when
// an operator set one.
func capacitySource(opts Config, nat *native.Backend) capacity.Source {
	return capacity.Host(capacity.HostOptions{DataDir: opts.DataDir, GroupTasks: nat.GroupTasks})
}

// registerCapacityMetrics exports the creates refused by limit and the
// sandboxes the host has room for.
func registerCapacityMetrics(reg *metrics.Registry, gate *capacity.Gate) {
	reg.CounterVecFunc("fence_capacity_refused_total", "Creates refused for lack of headroom on a host limit, by limit.", func() []metrics.Value {
		refused := gate.Refused()
		out := make([]metrics.Value, 0, len(capacity.Limits))
		for _, l := range capacity.Limits {
			out = append(out, metrics.Value{Labels: []string{"limit", string(l)}, V: float64(refused[l])})
		}
		return out
	})
	reg.GaugeFunc("fence_capacity_sandboxes_left", "Sandboxes the tightest host limit still has room for.", func() int64 {
		return gate.Status().Sandboxes
	})
}

// tuneAndReportKernel raises the kernel's knobs when tune is set
// (fence serve --tune-kernel), then logs each knob and the sandboxes it
// allows, and warns (on out) of pid_max below what maxSandboxes need.
func tuneAndReportKernel(tune bool, maxSandboxes int, out io.Writer, log *slog.Logger) error {
	if tune {
		changed, err := capacity.Tune("")
		for _, c := range changed {
			log.Info("kernel tuned", "knob", c)
		}
		if err != nil {
			return fmt.Errorf("--tune-kernel: %w", err)
		}
		// The daemon's own descriptors bound its sandboxes next: up to
		// fs.nr_open, as a service's LimitNOFILE=infinity does.
		if nrOpen, err := readUint("/proc/sys/fs/nr_open"); err == nil {
			c, err := capacity.RaiseNoFile(nrOpen)
			if c != "" {
				log.Info("kernel tuned", "knob", c)
			}
			if err != nil {
				// Without CAP_SYS_RESOURCE (a container, a unit that
				// drops it) the hard limit stays the service's.
				log.Warn("--tune-kernel: the daemon's open files stay at its hard limit; raise LimitNOFILE", "err", err)
			}
		}
	}
	for _, k := range capacity.ReadKnobs("") {
		attrs := []any{"knob", k.Name, "value", k.Value, "bounds", k.Bounds}
		if k.Per > 0 {
			attrs = append(attrs, "sandboxes", k.Sandboxes)
		}
		log.Info("kernel limit", attrs...)
		if k.Per > 0 && k.Sandboxes < int64(maxSandboxes) && strings.HasPrefix(k.Name, "kernel.pid_max") {
			fmt.Fprintf(out, "fence: %s %d allows about %d idle sandboxes (fewer than --max-sandboxes %d); fence serve --tune-kernel raises it\n",
				k.Name, k.Value, k.Sandboxes, maxSandboxes)
		}
	}
	return nil
}

// readUint reads a number from a /proc file.
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}
