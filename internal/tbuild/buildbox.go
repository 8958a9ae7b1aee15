package tbuild

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/isolation"
)

// buildBox is a sandbox a build runs steps in.
type buildBox struct {
	s      *Service
	sbs    Sandboxes // where it runs
	id     string
	handle string
	envd   *client.Envd
	layers isolation.LayerReader
	tr     *http.Transport
}

// buildBackend is the isolation backend of build sandboxes.
const buildBackend = "native"

// startBox creates a sandbox of tree in sbs (the sandbox manager): the
// same isolation and limits as any sandbox, egress limited to the build
// allowlist.
//
// With rt, the sandbox is started as the template's will be: its start
// command started and its ready command passed (the sandbox manager runs
// them at create).
func (s *Service) startBox(ctx context.Context, sbs Sandboxes, buildID, tree string, rt *Runtime) (*buildBox, error) {
	handle := ".build-layer-" + newID(16)
	s.mu.Lock()
	s.layers[handle] = s.content.TreePath(tree)
	if rt != nil {
		s.boxRuntimes[handle] = *rt
	}
	rec := s.builds[buildID]
	cpus, mem := 0, 0
	if rec != nil {
		cpus, mem = rec.CPUs, rec.MemoryMB
	}
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.layers, handle)
		delete(s.boxRuntimes, handle)
		s.mu.Unlock()
	}
	id, box, err := sbs.CreateBox(ctx, BoxSpec{
		Template: handle, BuildID: buildID, Timeout: maxBuildTime,
		// The build reads the sandbox's layer (isolation.LayerReader),
		// which native sandboxes give and gVisor's, whose writable layer
		// is gVisor's own overlay file, do not: a build runs on native
		// whatever the daemon's default backend.
		Backend:  buildBackend,
		CPUs:     float64(cpus),
		MemoryMB: int64(mem),
		Network:  &api.NetworkConfig{AllowOut: slices.Clone(s.opts.Allow), DenyOut: []string{"0.0.0.0/0"}},
	})
	if err != nil {
		forget()
		return nil, err
	}
	lr, isLR := isolation.As[isolation.LayerReader](box)
	if !isLR {
		_ = sbs.Kill(context.WithoutCancel(ctx), id)
		forget()
		return nil, errors.New("the sandbox backend cannot read a sandbox's layer")
	}
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return box.DialAgent(ctx) },
		DisableCompression: true,
	}
	e := client.NewEnvd(&http.Client{Transport: tr}, "http://agent", nil).WithUser("root")
	s.logf(buildID, "debug", "", "build sandbox %s started", id)
	return &buildBox{s: s, sbs: sbs, id: id, handle: handle, envd: e, layers: lr, tr: tr}, nil
}

func (b *buildBox) kill() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.sbs.Kill(ctx, b.id); err != nil {
		b.s.log.Warn("killing a build sandbox", "sandbox_id", b.id, "err", err)
	}
	b.tr.CloseIdleConnections()
	b.s.mu.Lock()
	delete(b.s.layers, b.handle)
	delete(b.s.boxRuntimes, b.handle)
	b.s.mu.Unlock()
}

// exec runs script with the build context's shell, env and workdir.
func (b *buildBox) exec(ctx context.Context, c buildCtx, user, script string, out io.Writer) (int, error) {
	env := copyEnv(c.Env)
	if pi := b.s.opts.PipIndex; pi != nil {
		for k, v := range pi.env() {
			if _, set := env[k]; !set {
				env[k] = v
			}
		}
	}
	if p, ok := env["PATH"]; ok {
		env["PATH"] = p + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	args := []string{"-l", "-c", script}
	if c.Shell == "/bin/sh" {
		args = []string{"-c", script}
	}
	st, err := b.envd.Run(ctx, client.ProcessSpec{Cmd: cmpOr(c.Shell, "/bin/bash"), Args: args, User: user,
		Cwd: c.Workdir, Env: env, Stdout: out, Stderr: out})
	if err != nil {
		return -1, err
	}
	if sig, ok := st.Signal(); ok {
		return 128 + int(sig), nil
	}
	if !st.Exited && st.Error != "" {
		return -1, errors.New(st.Error)
	}
	return st.ExitCode, nil
}

// lineWriter calls fn for each line written.
type lineWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			if w.buf.Len() > maxLogLine {
				w.fn(w.buf.String())
				w.buf.Reset()
			}
			return len(p), nil
		}
		line := strings.TrimRight(string(w.buf.Next(i+1)), "\r\n")
		w.fn(line)
	}
}

// Flush emits a last line without its newline.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 0 {
		w.fn(w.buf.String())
		w.buf.Reset()
	}
}
