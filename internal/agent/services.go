package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/internal/agent/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

// ServicesFile is where a template declares the services the agent starts
// with the sandbox (the code-interpreter template's server on port 49999).
// It is read from the sandbox's own root filesystem: a sandbox that
// rewrites it changes only what its own agent starts in its next life,
// which it could start itself.
const ServicesFile = "/etc/fence/services.json"

// maxServicesFile bounds ServicesFile; maxServices bounds its entries.
const (
	maxServicesFile = 64 << 10
	maxServices     = 8
)

// Service is one entry of ServicesFile.
type Service struct {
	Name string            `json:"name"`
	Argv []string          `json:"argv"`
	User string            `json:"user"` // "" = the sandbox's default user
	Dir  string            `json:"dir"`  // "" = the user's workdir
	Env  map[string]string `json:"env"`
}

// servicesConfig is the content of ServicesFile.
type servicesConfig struct {
	Services []Service `json:"services"`
}

// readServices reads and checks path. A missing file is no services.
func readServices(path string) ([]Service, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer f.Close()
	b := make([]byte, maxServicesFile+1)
	n, err := f.Read(b)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if n > maxServicesFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxServicesFile)
	}
	var cfg servicesConfig
	if err := json.Unmarshal(b[:n], &cfg); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	if len(cfg.Services) > maxServices {
		return nil, fmt.Errorf("%s declares %d services, at most %d", path, len(cfg.Services), maxServices)
	}
	for i, s := range cfg.Services {
		if len(s.Argv) == 0 || s.Argv[0] == "" {
			return nil, fmt.Errorf("%s: service %d (%q) has no argv", path, i, s.Name)
		}
	}
	return cfg.Services, nil
}

// Restart backoff of a service that exits: it doubles from the first
// delay up to the last, and starts again from the first after a service
// has run for serviceStable.
const (
	serviceBackoffMin = 200 * time.Millisecond
	serviceBackoffMax = 10 * time.Second
	serviceStable     = 30 * time.Second
)

// runServices starts every service of ServicesFile and restarts the ones
// that exit, until ctx ends. Services run through the agent's reaper and
// process service, so they are killed with the agent's other processes
// when the agent closes. Their stdio is /dev/null.
func runServices(ctx context.Context, path string, procs *process.Service, resolver *users.Resolver, log *slog.Logger) {
	svcs, err := readServices(path)
	if err != nil {
		log.Warn("template services not started", "err", err)
		return
	}
	for _, svc := range svcs {
		go superviseService(ctx, svc, procs, resolver, log.With("service", svc.Name))
	}
}

func superviseService(ctx context.Context, svc Service, procs *process.Service, resolver *users.Resolver, log *slog.Logger) {
	backoff := serviceBackoffMin
	for ctx.Err() == nil {
		started := time.Now()
		if err := runService(ctx, svc, procs, resolver); err != nil {
			log.Warn("service", "err", err)
		}
		if time.Since(started) > serviceStable {
			backoff = serviceBackoffMin
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, serviceBackoffMax)
	}
}

// runService runs svc once, until it exits or ctx ends (then its process
// group is killed).
func runService(ctx context.Context, svc Service, procs *process.Service, resolver *users.Resolver) error {
	var u *users.User
	var err error
	if svc.User == "" {
		u, err = resolver.Default()
	} else {
		u, err = resolver.ByName(svc.User)
	}
	if err != nil {
		return fmt.Errorf("user %q: %w", svc.User, err)
	}
	null, err := os.OpenFile("/dev/null", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening /dev/null: %w", err)
	}
	pid, exited, err := procs.Spawn(process.SpawnSpec{User: u, Argv: svc.Argv, Env: svc.Env, Dir: svc.Dir,
		Stdio: [3]*os.File{null, null, null}})
	null.Close()
	if err != nil {
		return err
	}
	select {
	case ws := <-exited:
		return fmt.Errorf("exited: %v", ws)
	case <-ctx.Done():
		_ = unix.Kill(-pid, unix.SIGKILL)
		<-exited
		return nil
	}
}
