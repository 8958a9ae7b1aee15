package tbuild

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/fencesandbox/fence/internal/oci"
	"github.com/fencesandbox/fence/internal/tbuild/content"
	"github.com/fencesandbox/fence/internal/tbuild/names"
	"github.com/fencesandbox/fence/internal/template"
)

var (
	octalRE  = regexp.MustCompile(`^[0-7]{3,4}$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	userRE   = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

// context of a build: E2B's build context (user, workdir, env).
type buildCtx struct {
	User    string            `json:"user"`
	Workdir string            `json:"workdir,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Shell   string            `json:"shell"` // /bin/bash, or /bin/sh where the tree has no bash
}

// layer is a cache entry: the tree a chain key built and the context
// after it.
type layer struct {
	Tree string   `json:"tree"`
	Ctx  buildCtx `json:"ctx"`
}

// maxLayerBytes bounds one step's writable layer as read back.
const maxLayerBytes = 16 << 30

// stepError fails a build at a step.
type stepError struct {
	step string
	msg  string
}

func (e *stepError) Error() string { return e.msg }

func (s *Service) run(ctx context.Context, sbs Sandboxes, buildID string, spec Spec) {
	start := time.Now()
	s.logf(buildID, "info", "base", "Building template %s", buildID)
	b := &builder{s: s, sbs: sbs, id: buildID, spec: spec}
	rt, tree, err := b.build(ctx)
	if b.box != nil {
		b.box.kill()
	}
	var digest string
	if err == nil && s.shares() {
		s.logf(buildID, "info", "finalize", "Pushing the template to the cluster's content registry")
		if digest, err = s.share(ctx, buildID, tree, rt); err != nil {
			err = &stepError{step: "finalize", msg: "pushing the template to the cluster's content registry: " + err.Error()}
		}
	}
	now := s.now().UTC()
	s.mu.Lock()
	rec := s.builds[buildID]
	if rec == nil { // deleted meanwhile: its trees go
		s.content.Unpin(buildID)
		s.mu.Unlock()
		s.collect(context.WithoutCancel(ctx), sbs)
		return
	}
	// Recorded, then unpinned, under s.mu: a collection sees the trees
	// in one or the other.
	for _, t := range s.content.Pinned(buildID) {
		s.recordLayerLocked(buildID, t)
	}
	s.content.Unpin(buildID)
	rec.UpdatedAt, rec.FinishedAt = now, &now
	if err == nil && rec.Status == StatusBuilding {
		rec.Status, rec.Tree, rec.Runtime, rec.ContentDigest = StatusReady, tree, rt, digest
		// Published under s.mu: the build is ready and its tags name it at
		// once for whoever reads either.
		s.names.Publish(rec.TemplateID, rec.ID, rec.Tags)
		defer s.names.Save(ctx, rec.TemplateID)
	} else {
		var se *stepError
		reason := &Reason{Step: "base"}
		switch {
		case errors.As(err, &se):
			reason.Step, reason.Message = se.step, se.msg
		case err == nil:
			reason.Message = "the build was canceled"
		case errors.Is(err, context.Canceled):
			reason.Message = "the build was canceled"
		case errors.Is(err, context.DeadlineExceeded):
			reason.Message = "the build took longer than " + maxBuildTime.String()
		default:
			reason.Message = err.Error()
		}
		rec.Status, rec.Reason = StatusError, reason
	}
	st := rec.Status
	s.mu.Unlock()
	if st == StatusReady {
		s.logf(buildID, "info", "finalize", "Template is ready (built in %s)", time.Since(start).Round(10*time.Millisecond))
	} else {
		s.mu.Lock()
		msg, step := rec.Reason.Message, rec.Reason.Step
		s.mu.Unlock()
		s.logf(buildID, "error", step, "Build failed: %s", msg)
	}
	s.saveBuild(context.WithoutCancel(ctx), rec)
}

// builder runs one build.
type builder struct {
	s    *Service
	sbs  Sandboxes // where the build's sandboxes run
	id   string
	spec Spec
	box  *buildBox // the sandbox of the current run of uncached steps
	// boxTree is the tree box started from.
	boxTree string
}

type stepPlan struct {
	label string // "base", "1".."N"
	typ   string
	args  []string
	hash  string
	force bool
	// files is a COPY's archive, opened when its key was made, so that
	// the step copies the files its key names; filesErr says why not.
	files    *os.File
	filesErr error
}

func (b *builder) build(ctx context.Context) (Runtime, string, error) {
	s := b.s
	cur, key, rt, err := b.base(ctx)
	if err != nil {
		return Runtime{}, "", err
	}
	// E2B's default-user phase, then the steps.
	plan := []stepPlan{{label: "base", typ: "USER", args: []string{"user", "true"}, force: b.spec.Force}}
	for i, st := range b.spec.Steps {
		plan = append(plan, stepPlan{label: fmt.Sprint(i + 1), typ: st.Type, args: st.Args, hash: st.FilesHash, force: st.Force || b.spec.Force})
	}
	n := len(b.spec.Steps)
	for i, st := range plan {
		digest := ""
		if st.typ == "COPY" {
			st.files, digest, st.filesErr = s.content.OpenArchive(ctx, st.hash)
		}
		key = stepKey(key, st.typ, st.args, st.hash, digest)
		if i == 0 {
			key = hashKeys(key, "DEFAULT USER", "user")
		}
		desc := fmt.Sprintf("[builder %d/%d] %s %s", i, n, st.typ, strings.Join(st.args, " "))
		if i == 0 {
			desc = "[builder] default user: user"
		}
		if !st.force {
			if l, ok := s.cached(b.id, key); ok {
				s.logf(b.id, "info", st.label, "CACHED %s [%s]", desc, key[:12])
				cur = l
				b.dropBox()
				st.closeFiles()
				continue
			}
		}
		t0 := time.Now()
		s.logf(b.id, "info", st.label, "%s", desc)
		next, err := b.step(ctx, cur, st)
		st.closeFiles()
		if err != nil {
			return Runtime{}, "", err
		}
		if err := s.keep(key, next); err != nil {
			return Runtime{}, "", err
		}
		s.saveLayers(ctx, b.id)
		cur = next
		s.logf(b.id, "info", st.label, "done in %s", time.Since(t0).Round(10*time.Millisecond))
	}
	b.dropBox()
	if b.spec.StartCmd != "" || b.spec.ReadyCmd != "" {
		rt.StartCmd, rt.ReadyCmd = b.spec.StartCmd, b.spec.ReadyCmd
		if rt.ReadyCmd == "" {
			rt.ReadyCmd = "sleep 20"
		}
	}
	rt.User, rt.Workdir = cur.Ctx.User, cur.Ctx.Workdir
	if rt.StartCmd != "" || rt.ReadyCmd != "" {
		if err := b.finalize(ctx, cur.Tree, rt); err != nil {
			return Runtime{}, "", err
		}
	}
	return rt, cur.Tree, nil
}

// finalize runs the start command and waits for the ready command once,
// in a sandbox of the final tree started the way the template's sandboxes
// will be, as E2B's finalize phase does: a start command that fails before
// it is ready, or a ready command that never passes, fails the build.
func (b *builder) finalize(ctx context.Context, tree string, rt Runtime) error {
	s := b.s
	t0 := time.Now()
	s.logf(b.id, "info", "finalize", "[finalize] start command: %q, ready command: %q (run once now and at every sandbox start)", rt.StartCmd, rt.ReadyCmd)
	box, err := s.startBox(ctx, b.sbs, b.id, tree, &rt)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		msg := err.Error()
		if i := strings.Index(msg, "start command failed"); i >= 0 {
			msg = msg[i:]
		} else if i := strings.Index(msg, "ready command timed out"); i >= 0 {
			msg = msg[i:]
		}
		return &stepError{step: "finalize", msg: msg}
	}
	box.kill()
	s.logf(b.id, "info", "finalize", "ready in %s", time.Since(t0).Round(10*time.Millisecond))
	return nil
}

func (b *builder) dropBox() {
	if b.box != nil {
		b.box.kill()
		b.box = nil
	}
}

// base makes (or finds) the base layer: a parent template's tree or an
// unpacked image.
func (b *builder) base(ctx context.Context) (layer, string, Runtime, error) {
	if t := imageTemplate(b.spec.FromImage); t != "" {
		b.s.logf(b.id, "info", "base", "FROM %s: fence's %s template", b.spec.FromImage, t)
		b.spec.FromImage, b.spec.FromTemplate = "", t
	}
	if b.spec.FromTemplate != "" {
		return b.fromTemplate(b.spec.FromTemplate)
	}
	l, key, err := b.fromImage(ctx, b.spec.FromImage)
	return l, key, Runtime{}, err
}

// baseError fails a build at its base step.
func baseError(format string, args ...any) error {
	return &stepError{step: "base", msg: fmt.Sprintf(format, args...)}
}

// fromTemplate is the base layer of a parent template: a built
// template's tree (its start and ready commands inherited) or, for a
// bare name that is none, a fence template's, used in place.
func (b *builder) fromTemplate(ref string) (layer, string, Runtime, error) {
	s := b.s
	n, err := names.ParseName(ref)
	if err != nil {
		return layer{}, "", Runtime{}, baseError("fromTemplate %q: %v", ref, err)
	}
	s.mu.Lock()
	_, pb, rerr := s.resolveLocked(n)
	if rerr == nil {
		tree, prt, pid := pb.Tree, pb.Runtime, pb.ID
		s.pinLocked(b.id, tree)
		s.mu.Unlock()
		key := hashKeys("v2", "template:"+pid)
		s.logf(b.id, "info", "base", "FROM template %s (build %s)", ref, pid)
		parent := layer{Tree: tree, Ctx: buildCtx{User: "root", Shell: shellOf(s.content.TreePath(tree))}}
		return parent, key, Runtime{StartCmd: prt.StartCmd, ReadyCmd: prt.ReadyCmd}, nil
	}
	s.mu.Unlock()
	if n.Namespace != "" || n.Tag != "" {
		return layer{}, "", Runtime{}, baseError("fromTemplate %q: %v", ref, rerr)
	}
	rootfs, err := s.opts.Parents.Resolve(n.Alias)
	if err != nil {
		return layer{}, "", Runtime{}, baseError("fromTemplate %q: template not found", ref)
	}
	fi, err := os.Stat(rootfs)
	if err != nil {
		return layer{}, "", Runtime{}, baseError("fromTemplate %q: %v", ref, err)
	}
	key := hashKeys("v2", "template:"+n.Alias, rootfs, fi.ModTime().UTC().Format(time.RFC3339Nano))
	s.logf(b.id, "info", "base", "FROM fence template %s", n.Alias)
	if l, ok := s.cached(b.id, key); ok {
		return l, key, Runtime{}, nil
	}
	// The built-in tree is used in place: it is as immutable as a layer.
	l := layer{Tree: rootfs, Ctx: buildCtx{User: "root", Shell: shellOf(rootfs)}}
	if err := s.keep(key, l); err != nil {
		return layer{}, "", Runtime{}, err
	}
	return l, key, Runtime{}, nil
}

// fromImage is the base layer of an image: cached, or pulled and
// unpacked into a new tree.
func (b *builder) fromImage(ctx context.Context, img string) (layer, string, error) {
	s := b.s
	key := hashKeys("v2", img)
	s.logf(b.id, "info", "base", "FROM %s", img)
	if !b.spec.Force {
		if l, ok := s.cached(b.id, key); ok {
			s.logf(b.id, "info", "base", "CACHED [base] FROM %s [%s]", img, key[:12])
			return l, key, nil
		}
	}
	if s.opts.Images == nil {
		return layer{}, "", baseError("fromImage %q: pulling images is not available on this server", img)
	}
	opts := oci.Options{Progress: &lineWriter{fn: func(line string) { s.logf(b.id, "info", "base", "%s", line) }}}
	s.mu.Lock()
	rc := s.creds[b.id]
	s.mu.Unlock()
	if rc != nil {
		auth, err := registryAuth(rc)
		if err != nil {
			return layer{}, "", baseError("fromImageRegistry: %v", err)
		}
		opts.Auth = auth
	}
	tmp, err := s.content.TempDir()
	if err != nil {
		return layer{}, "", err
	}
	defer os.RemoveAll(tmp)
	c, err := b.unpack(ctx, img, tmp, opts)
	if err != nil {
		return layer{}, "", err
	}
	tree := "img-" + key[:32]
	s.pin(b.id, tree)
	if err := s.content.Commit(tmp, tree); err != nil {
		return layer{}, "", err
	}
	l := layer{Tree: tree, Ctx: c}
	if err := s.keep(key, l); err != nil {
		return layer{}, "", err
	}
	return l, key, nil
}

// unpack unpacks img into dir, records its digest in the build and
// returns the build context its configuration gives (workdir, env).
func (b *builder) unpack(ctx context.Context, img, dir string, opts oci.Options) (buildCtx, error) {
	s := b.s
	image, err := s.opts.Images.Unpack(ctx, img, dir, opts)
	if err != nil {
		return buildCtx{}, baseError("pulling image %q: %v", img, err)
	}
	s.logf(b.id, "info", "base", "image %s (%s)", image.Ref, image.Digest)
	s.mu.Lock()
	if rec := s.builds[b.id]; rec != nil {
		rec.ImageDigest = image.Digest
	}
	s.mu.Unlock()
	if err := template.Finalize(dir); err != nil {
		return buildCtx{}, err
	}
	c := buildCtx{User: "root", Workdir: image.Config.WorkingDir, Env: map[string]string{}, Shell: shellOf(dir)}
	for _, kv := range image.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			c.Env[k] = v
		}
	}
	return c, nil
}

// imageTemplate is the fence template standing for E2B's own images
// (the SDK's default base, e2bdev/base), or "".
func imageTemplate(img string) string {
	ref := strings.TrimPrefix(strings.TrimPrefix(img, "docker.io/"), "index.docker.io/")
	ref = strings.TrimSuffix(ref, ":latest")
	switch ref {
	case "e2bdev/base":
		return "base"
	case "e2bdev/code-interpreter":
		return "code-interpreter"
	}
	return ""
}

// registryAuth maps fromImageRegistry to the puller's credentials.
func registryAuth(rc *RegistryConfig) (*oci.Auth, error) {
	switch rc.Type {
	case "registry":
		if rc.Username == "" || rc.Password == "" {
			return nil, errors.New("registry credentials need a username and a password")
		}
		return &oci.Auth{Username: rc.Username, Password: rc.Password}, nil
	case "gcp":
		// Google's registries take a service-account key as the password
		// of the user _json_key.
		if !json.Valid([]byte(rc.ServiceAccountJSON)) {
			return nil, errors.New("gcp: serviceAccountJson is not valid JSON")
		}
		return &oci.Auth{Username: "_json_key", Password: rc.ServiceAccountJSON}, nil
	case "aws":
		return nil, errors.New("aws: pulling from Amazon ECR with access keys is not supported by fence; " +
			"use fromImage with {username: \"AWS\", password: <the output of `aws ecr get-login-password`>} instead")
	}
	return nil, fmt.Errorf("unknown registry type %q", rc.Type)
}

// shellOf is the shell steps run with in tree: bash if it has one.
func shellOf(tree string) string {
	for _, p := range []string{"bin/bash", "usr/bin/bash"} {
		if _, err := os.Lstat(filepath.Join(tree, p)); err == nil {
			return "/bin/bash"
		}
	}
	return "/bin/sh"
}

// step runs one step from layer cur.
func (b *builder) step(ctx context.Context, cur layer, st stepPlan) (layer, error) {
	s := b.s
	c := cur.Ctx
	c.Env = copyEnv(c.Env)
	fail := func(format string, args ...any) (layer, error) {
		return layer{}, &stepError{step: st.label, msg: fmt.Sprintf(format, args...)}
	}
	if st.typ == "ENV" {
		if c.Env == nil {
			c.Env = map[string]string{}
		}
		for i := 0; i+1 < len(st.args); i += 2 {
			c.Env[st.args[i]] = os.Expand(st.args[i+1], func(k string) string { return c.Env[k] })
		}
		return layer{Tree: cur.Tree, Ctx: c}, nil
	}
	if b.box == nil {
		box, err := s.startBox(ctx, b.sbs, b.id, cur.Tree, nil)
		if err != nil {
			return fail("starting the build sandbox: %v", err)
		}
		b.box, b.boxTree = box, cur.Tree
	}
	out := &lineWriter{fn: func(line string) { s.logf(b.id, "info", st.label, "%s", line) }}
	defer out.Flush()
	var script, user string
	switch st.typ {
	case "RUN":
		script, user = st.args[0], c.User
		if len(st.args) == 2 && st.args[1] != "" {
			user = st.args[1]
		}
	case "WORKDIR":
		p := st.args[0]
		if !path.IsAbs(p) {
			p = path.Join(cmpOr(c.Workdir, "/"), p)
		}
		p = path.Clean(p)
		script, user = fmt.Sprintf(`[ -d %[1]s ] || { mkdir -p %[1]s && chown "$(id -u %[2]s):$(id -g %[2]s)" %[1]s; }`, shellQuote(p), shellQuote(c.User)), "root"
		c.Workdir = p
	case "USER":
		u := st.args[0]
		script = fmt.Sprintf(`id -u %[1]s >/dev/null 2>&1 || useradd --create-home --shell /bin/bash %[1]s 2>/dev/null || adduser -D -s /bin/sh %[1]s`, shellQuote(u))
		if len(st.args) == 2 && st.args[1] == "true" {
			script += fmt.Sprintf(` && { passwd -d %[1]s >/dev/null 2>&1 || true; } && { getent group sudo >/dev/null 2>&1 && usermod -aG sudo %[1]s 2>/dev/null || true; } && if [ -d /etc/sudoers.d ]; then printf '%%s ALL=(ALL:ALL) NOPASSWD: ALL\n' %[1]s > /etc/sudoers.d/%[1]s && chmod 0440 /etc/sudoers.d/%[1]s; fi`, shellQuote(u))
		}
		user = "root"
		c.User = u
	case "COPY":
		var err error
		script, err = b.copyScript(ctx, st, c)
		if err != nil {
			return fail("%v", err)
		}
		user = "root"
	}
	run := c
	run.Workdir = cur.Ctx.Workdir // WORKDIR runs where the step before left
	code, err := b.box.exec(ctx, run, user, script, out)
	out.Flush()
	if err != nil {
		if ctx.Err() != nil {
			return layer{}, ctx.Err()
		}
		return fail("failed to run command '%s': %v", script, err)
	}
	if code != 0 {
		if st.typ == "RUN" {
			return fail("failed to run command '%s': command failed: exit status %d", st.args[0], code)
		}
		return fail("%s %s failed: exit status %d", st.typ, strings.Join(st.args, " "), code)
	}
	tree, err := b.snapshot(ctx)
	if err != nil {
		return layer{}, err
	}
	return layer{Tree: tree, Ctx: c}, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func copyEnv(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// copyScript puts the step's archive into the sandbox and returns the
// script (run as root there) that places it, E2B's COPY semantics.
func (b *builder) copyScript(ctx context.Context, st stepPlan, c buildCtx) (string, error) {
	f := st.files
	if errors.Is(st.filesErr, fs.ErrNotExist) {
		return "", fmt.Errorf("COPY %s: the files with hash %s were never uploaded", st.args[0], st.hash)
	}
	if st.filesErr != nil {
		return "", fmt.Errorf("COPY %s: the files with hash %s: %v", st.args[0], st.hash, st.filesErr)
	}
	b.s.content.TouchArchive(st.hash)
	staging := "/tmp/.fence-copy-" + st.hash[:16]
	if err := b.box.envd.WriteFile(ctx, staging+".tar", f); err != nil {
		return "", fmt.Errorf("COPY %s: putting the files in the build sandbox: %v", st.args[0], err)
	}
	src, dest := st.args[0], st.args[1]
	// The static prefix of the pattern: up to the last '/' before a glob.
	prefix := src
	if i := strings.IndexAny(src, "*?[{"); i >= 0 {
		prefix = src[:i]
		if j := strings.LastIndex(prefix, "/"); j >= 0 {
			prefix = prefix[:j]
		} else {
			prefix = "."
		}
	}
	prefix = content.CleanRel(prefix)
	if prefix == "" {
		prefix = "."
	}
	owner := c.User
	if len(st.args) > 2 && st.args[2] != "" {
		owner = st.args[2]
	}
	mode := ""
	if len(st.args) > 3 {
		mode = st.args[3]
	}
	if !path.IsAbs(dest) {
		base := c.Workdir
		if base == "" {
			base = "$(getent passwd " + shellQuote(c.User) + " | cut -d: -f6)"
		}
		dest = base + "/" + shellQuote(dest)
	} else {
		dest = shellQuote(dest)
	}
	trail := ""
	if strings.HasSuffix(st.args[1], "/") {
		trail = "/"
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "set -e\nu=%s\nrm -rf \"$u\"; mkdir -p \"$u/unpack\"\ntar -xf \"$u.tar\" -C \"$u/unpack\" --no-same-owner 2>/dev/null || tar -xf \"$u.tar\" -C \"$u/unpack\"\n", staging)
	fmt.Fprintf(&sb, "src=\"$u/unpack\"/%s\ndest=%s%s\n", shellQuote(prefix), dest, trail)
	fmt.Fprintf(&sb, "chown -R -h \"$(id -u %[1]s):$(id -g %[1]s)\" \"$src\"\n", shellQuote(owner))
	if mode != "" {
		fmt.Fprintf(&sb, "chmod -R %s \"$src\"\n", mode)
	}
	sb.WriteString(`if [ -d "$src" ] && [ ! -L "$src" ]; then mkdir -p "$dest"; cp -a "$src"/. "$dest"/
else case "$dest" in */) mkdir -p "$dest"; cp -a "$src" "$dest";; *) mkdir -p "$(dirname "$dest")"; rm -rf "$dest" 2>/dev/null || true; cp -a "$src" "$dest";; esac; fi
rm -rf "$u" "$u.tar"
`)
	return sb.String(), nil
}

// closeFiles closes the step's archive, if it has one.
func (st *stepPlan) closeFiles() {
	if st.files != nil {
		st.files.Close()
		st.files = nil
	}
}

// snapshot makes a tree of the box's start tree plus its writable layer.
func (b *builder) snapshot(ctx context.Context) (string, error) {
	s := b.s
	tmp, err := s.content.TempDir()
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	spool, err := s.content.TempFile()
	if err != nil {
		return "", err
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	if err := b.box.layers.ExportLayer(ctx, spool, maxLayerBytes); err != nil {
		return "", fmt.Errorf("reading the build sandbox's layer: %w", err)
	}
	root := filepath.Join(tmp, "rootfs")
	if err := content.CloneTree(ctx, s.content.TreePath(b.boxTree), root); err != nil {
		return "", fmt.Errorf("copying the layer below: %w", err)
	}
	if err := content.ApplyLayer(ctx, root, spool.Name()); err != nil {
		return "", fmt.Errorf("applying the step's changes: %w", err)
	}
	if err := template.Finalize(root); err != nil {
		return "", err
	}
	name := "l-" + newID(24)
	s.pin(b.id, name)
	if err := s.content.Place(root, name); err != nil {
		return "", err
	}
	return name, nil
}
