package sandbox

import (
	"fmt"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/isolation"
)

// Bounds on create input. They keep one request from asking for absurd
// resources or storing unbounded data.
const (
	maxTemplateLen   = 256
	maxCPUs          = 64
	minMemoryMB      = 16
	maxMemoryMB      = 256 << 10 // 256 GiB
	maxDiskMB        = 1 << 20   // 1 TiB
	maxMetadataPairs = 100
	maxMetadataKey   = 256
	maxMetadataValue = 4096
	maxEnvVars       = 1000
	maxEnvTotal      = 256 << 10
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), api.ErrInvalidArgument)
}

// checkTimeout checks a timeout a request asks for against the longest
// one allowed.
func checkTimeout(d, maxTimeout time.Duration) error {
	if maxTimeout == noMaxTimeout && d > 0 {
		return nil
	}
	if d <= 0 || d > maxTimeout {
		return invalid("timeout %v is out of range: it must be more than 0s and at most %v", d, maxTimeout)
	}
	return nil
}

// noMaxTimeout is the Manager's maxTimeout when no cap is set: longer
// than any timeout the API can express (int32 seconds).
const noMaxTimeout = time.Duration(1<<62 - 1)

// maxIdleTimeout bounds an idle timeout.
const maxIdleTimeout = 30 * 24 * time.Hour

// checkIdleTimeout checks an idle timeout (0: none).
func checkIdleTimeout(d time.Duration) error {
	if d < 0 || d > maxIdleTimeout {
		return invalid("lifecycle.idleTimeout %v is out of range: it must be 0 (never) or at most %v", d, maxIdleTimeout)
	}
	if d > 0 && d < time.Second {
		return invalid("lifecycle.idleTimeout %v is out of range: it must be 0 (never) or at least 1s", d)
	}
	return nil
}

// validate checks req and returns the effective timeout and limits: the
// request's, or d's where it names none, within maxTimeout.
func validate(req CreateRequest, d Defaults, maxTimeout time.Duration) (time.Duration, isolation.Limits, error) {
	var lim isolation.Limits
	if req.TemplateID == "" {
		return 0, lim, invalid("templateID is required")
	}
	if len(req.TemplateID) > maxTemplateLen {
		return 0, lim, invalid("templateID is longer than %d bytes", maxTemplateLen)
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = d.Timeout
	}
	if err := checkTimeout(timeout, maxTimeout); err != nil {
		return 0, lim, err
	}
	if req.IdleTimeout != nil {
		if err := checkIdleTimeout(*req.IdleTimeout); err != nil {
			return 0, lim, err
		}
	}
	cpus := req.CPUs
	if cpus == 0 {
		cpus = d.CPUs
	}
	if !(cpus > 0 && cpus <= maxCPUs) { // also rejects NaN
		return 0, lim, invalid("cpuCount %v is out of range (0, %d]", cpus, maxCPUs)
	}
	mem := req.MemoryMB
	if mem == 0 {
		mem = d.MemoryMB
	}
	if mem < minMemoryMB || mem > maxMemoryMB {
		return 0, lim, invalid("memoryMB %d is out of range [%d, %d]", mem, minMemoryMB, maxMemoryMB)
	}
	disk := req.DiskMB
	if disk == 0 {
		disk = d.DiskMB
	}
	if disk < 1 || disk > maxDiskMB {
		return 0, lim, invalid("diskSizeMB %d is out of range [1, %d]", disk, maxDiskMB)
	}
	if err := validateMetadata(req.Metadata); err != nil {
		return 0, lim, err
	}
	if err := validateEnv(req.EnvVars); err != nil {
		return 0, lim, err
	}
	lim = isolation.Limits{
		CPUs:        cpus,
		MemoryBytes: mem << 20,
		Pids:        d.Pids,
		DiskBytes:   disk << 20,
		NoFile:      d.NoFile,
	}
	return timeout, lim, nil
}

func validateMetadata(md map[string]string) error {
	if len(md) > maxMetadataPairs {
		return invalid("metadata has %d pairs, at most %d are allowed", len(md), maxMetadataPairs)
	}
	for k, v := range md {
		if k == "" || len(k) > maxMetadataKey {
			return invalid("metadata key %q must be 1 to %d bytes", trunc(k), maxMetadataKey)
		}
		if len(v) > maxMetadataValue {
			return invalid("metadata value of %q is longer than %d bytes", trunc(k), maxMetadataValue)
		}
	}
	return nil
}

func validateEnv(env map[string]string) error {
	if len(env) > maxEnvVars {
		return invalid("envVars has %d entries, at most %d are allowed", len(env), maxEnvVars)
	}
	total := 0
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalid("envVars name %q is not a valid variable name", trunc(k))
		}
		if strings.ContainsRune(v, 0) {
			return invalid("envVars value of %q contains a NUL byte", trunc(k))
		}
		total += len(k) + len(v)
	}
	if total > maxEnvTotal {
		return invalid("envVars total %d bytes, at most %d are allowed", total, maxEnvTotal)
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}
