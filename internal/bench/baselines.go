package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// baselineName is the host's own fork+exec, the peer of an exec in a
// running sandbox.
const baselineName = "baseline fork+exec /bin/true"

// nobody is the host user the baseline's /bin/true runs as.
const nobody = 65534

// hostTrue forks and executes the root filesystem's /bin/true on the
// host, chrooted there, with its output collected through a pipe as the
// agent collects a command's: the same binary and the same files as the
// sandbox's exec, without fence. A template's files are not the host's:
// the child drops to nobody after the chroot, so what it runs has no
// privilege on the host (and no way out of the chroot).
func hostTrue(ctx context.Context, rootfs string) error {
	cmd := exec.CommandContext(ctx, "/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs,
		Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
	cmd.Dir = "/"
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("/bin/true in %s: %w: %s", rootfs, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func runcMeasure(ctx context.Context, opts Options) Result {
	name := "runc run /bin/true"
	bundle, err := ociBundle(ctx, opts)
	if err != nil {
		return Result{Name: name, Err: err}
	}
	state := filepath.Join(opts.WorkDir, "runc-state")
	return measure(name, opts.Iterations, func(i int) error {
		return run(ctx, "runc", "--root", state, "run", "--bundle", bundle, newID("benchrunc"))
	})
}

// ociBundle writes (once) an OCI bundle running /bin/true in opts.RootFS,
// read-only, from runc's default spec, and returns its directory.
func ociBundle(ctx context.Context, opts Options) (string, error) {
	bundle := filepath.Join(opts.WorkDir, "bundle")
	if _, err := os.Stat(filepath.Join(bundle, "config.json")); err == nil {
		return bundle, nil
	}
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return "", err
	}
	if err := run(ctx, "runc", "spec", "--bundle", bundle); err != nil {
		return "", err
	}
	spec, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if err := json.Unmarshal(spec, &doc); err != nil {
		return "", err
	}
	doc["root"] = map[string]any{"path": opts.RootFS, "readonly": true}
	proc, _ := doc["process"].(map[string]any)
	if proc == nil {
		return "", errors.New("runc spec has no process")
	}
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	if spec, err = json.Marshal(doc); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), spec, 0o600); err != nil {
		return "", err
	}
	return bundle, nil
}

// RunscPath is where fence's build scripts leave gVisor's runsc; the
// FENCE_RUNSC environment variable overrides it.
const RunscPath = "/var/lib/fence/cache/runsc/runsc"

// runscBinary returns the runsc to measure, or "" when there is none.
func runscBinary() string {
	for _, p := range []string{os.Getenv("FENCE_RUNSC"), RunscPath} {
		if p == "" {
			continue
		}
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return ""
}

// runscMeasure runs the runc bundle under gVisor's runsc (no network, as
// bwrap's --unshare-all and fence's default-deny).
func runscMeasure(ctx context.Context, opts Options, runsc string) Result {
	name := "runsc run /bin/true"
	bundle, err := ociBundle(ctx, opts)
	if err != nil {
		return Result{Name: name, Err: err}
	}
	state := filepath.Join(opts.WorkDir, "runsc-state")
	// runsc pins an empty network namespace for its gofers by a bind
	// mount in its state root, and leaves it there: without this, every
	// run of the benchmark left one mount on the host.
	defer func() {
		for unix.Unmount(filepath.Join(state, "null-netns"), unix.MNT_DETACH) == nil {
		}
	}()
	return measure(name, opts.Iterations, func(i int) error {
		return run(ctx, runsc, "--root", state, "--network=none", "run", "--bundle", bundle, newID("benchrunsc"))
	})
}
