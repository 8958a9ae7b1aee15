package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fencesandbox/fence/internal/isolation"
)

// imageDir is where a paused sandbox's checkpoint lives.
func (s *sandbox) imageDir() string { return filepath.Join(s.dir, "image") }

// Pause implements isolation.Pauser: it checkpoints the sandbox (memory,
// processes, open files, the overlay's contents) into its image directory
// with `runsc checkpoint`, after which nothing of the sandbox runs on the
// host, and closes its network. A failed checkpoint leaves it running.
//
// The checkpoint waits first, for at most cgroup.SettleWait, until the sandbox
// is idle (see settle): a command started just before the pause has then
// got past its start (a login shell reading its profile, an interpreter
// loading) to its own work, a sleep or a server waiting, whose timers
// run on the wall clock through the pause as on native's frozen cgroup.
func (s *sandbox) Pause(ctx context.Context) error {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if change, err := isolation.PauseChange(s.id, s.done, s.killed, s.paused.Load(), true); !change {
		return err
	}
	s.settle(ctx)
	s.paused.Store(true)
	ctx = context.WithoutCancel(ctx)
	if err := s.checkpointLocked(ctx, s.imageDir(), false); err != nil {
		s.paused.Store(false)
		return fmt.Errorf("pausing sandbox %s: %w", s.id, err)
	}
	s.endRun()
	// The stopped container goes now, not on the resume's path; a restore
	// makes it anew (and Adopt deletes one a crash left).
	if err := s.b.run(ctx, nil, "delete", "--force", s.id); err != nil && !notExist(err) {
		s.b.log.Warn("deleting a checkpointed container", "sandbox_id", s.id, "err", err)
	}
	return nil
}

// settle waits for the sandbox to go idle before a checkpoint (see
// cgroup.Group.Settle). A checkpoint that follows a process start at once
// would stop the process inside gVisor's exec or its shell's start-up,
// which take tens to hundreds of milliseconds on gVisor.
func (s *sandbox) settle(ctx context.Context) {
	if s.cg == nil {
		return
	}
	waited, quiet := s.cg.Settle(ctx, s.done)
	s.b.log.Debug("sandbox settled for a pause", "sandbox_id", s.id, "waited", waited, "quiet", quiet)
}

// checkpointLocked writes the sandbox's checkpoint to dir, which must not
// exist yet (an image is written once and never changed, so it can be
// restored any number of times). With leaveRunning the sandbox goes on
// running after it (a snapshot); without, its run ends.
//
// +checklocks:s.pmu
func (s *sandbox) checkpointLocked(ctx context.Context, dir string, leaveRunning bool) error {
	tmp := dir + ".partial"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("creating checkpoint directory: %w", err)
	}
	args := []string{"checkpoint", "--image-path", tmp}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	if err := s.b.run(ctx, nil, append(args, s.id)...); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	// The image is complete only once renamed into place: a crash during
	// the checkpoint leaves a .partial directory, never a bad image.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("completing checkpoint: %w", err)
	}
	return nil
}

// Resume implements isolation.Pauser: it restores the sandbox's checkpoint
// into a fresh network namespace and stack (with the policy last set) and
// returns once its agent answers. The image is removed once restored.
func (s *sandbox) Resume(ctx context.Context) error {
	s.pmu.Lock()
	change, err := isolation.PauseChange(s.id, s.done, s.killed, s.paused.Load(), false)
	s.pmu.Unlock()
	if !change {
		return err
	}
	// Pause, Resume and Kill of one sandbox are serialised by the caller
	// (sandbox.Manager); a Kill meanwhile makes the restore fail.
	ctx = context.WithoutCancel(ctx)
	if err := s.startRun(ctx, s.imageDir(), ""); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", s.id, err)
	}
	s.paused.Store(false)
	if err := os.RemoveAll(s.imageDir()); err != nil {
		s.b.log.Warn("removing a restored checkpoint", "sandbox_id", s.id, "err", err)
	}
	return nil
}

// Adopt implements isolation.Adopter: it takes over sandbox id, paused by
// an earlier backend on the same state directory (a daemon before a
// restart), from its checkpoint image. The sandbox comes back paused;
// Resume restores it, attaching each run's namespace to nw. Without a
// complete image it fails with an error wrapping isolation.ErrNotFound,
// and Cleanup removes what is left.
func (b *Backend) Adopt(ctx context.Context, id string, nw isolation.Network) (isolation.Sandbox, error) {
	if nw == nil {
		return nil, fmt.Errorf("adopting sandbox %s: no network fence", id)
	}
	if !idPattern.MatchString(id) {
		return nil, fmt.Errorf("invalid sandbox id %q", id)
	}
	dir := filepath.Join(b.sbDir, id)
	raw, err := os.ReadFile(filepath.Join(dir, "record.json"))
	if err != nil {
		return nil, fmt.Errorf("adopting sandbox %s: %w", id, errors.Join(err, isolation.ErrNotFound))
	}
	var rec record
	if err := json.Unmarshal(raw, &rec); err != nil || rec.ID != id {
		return nil, fmt.Errorf("adopting sandbox %s: bad record: %w", id, isolation.ErrNotFound)
	}
	s := &sandbox{b: b, id: id, dir: dir, rec: rec, done: make(chan struct{}), nw: nw}
	if st, err := os.Stat(s.imageDir()); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("adopting sandbox %s: no checkpoint: %w", id, isolation.ErrNotFound)
	}
	if s.cg, err = b.cg.Open(id); err != nil {
		l := rec.Limits
		if s.cg, err = b.cg.Create(id, cgroupLimits(l)); err != nil {
			return nil, fmt.Errorf("adopting sandbox %s: %w", id, err)
		}
	}
	s.paused.Store(true)
	if err := b.register(s); err != nil {
		return nil, err
	}
	// A crash between the checkpoint and its container's delete leaves
	// the stopped container in runsc's state.
	if err := b.run(ctx, nil, "delete", "--force", id); err != nil && !notExist(err) {
		b.log.Warn("deleting a checkpointed container", "sandbox_id", id, "err", err)
	}
	return s, nil
}

var (
	_ isolation.Adopter = (*Backend)(nil)
	_ isolation.Keeper  = (*sandbox)(nil)
)

// Kept implements isolation.Keeper: a paused sandbox whose checkpoint is
// complete is kept on disk.
func (s *sandbox) Kept() bool {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if s.killed || !s.paused.Load() {
		return false
	}
	st, err := os.Stat(s.imageDir())
	return err == nil && st.IsDir()
}
