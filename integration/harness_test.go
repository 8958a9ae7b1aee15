package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// sandboxUIDBase is the first host uid the native backend maps sandboxes to.
const sandboxUIDBase = 1 << 24

// instanceOf is the native backend instance of `fence serve` on dataDir:
// "serve-" and a hash of its state directory, with the data dir's symlinks
// resolved as the daemon resolves them.
func instanceOf(dataDir string) string {
	abs, _ := filepath.Abs(dataDir)
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	sum := sha256.Sum256([]byte(filepath.Join(abs, "native")))
	return "serve-" + hex.EncodeToString(sum[:4])
}

// syncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// daemon is one `fence serve` process run by a test.
type daemon struct {
	t       *testing.T
	DataDir string
	URL     string
	Key     string
	Client  *client.Client

	cmd     *exec.Cmd
	out     *syncBuffer // stdout and stderr, interleaved
	exited  chan struct{}
	waitErr error
	extra   []string // the flags of startDaemon, kept for Restart
}

// templatesDir returns the directory holding the test templates, making
// sure minimal is built.
func templatesDir(t testing.TB) string {
	t.Helper()
	testutil.Templates(t)
	if d := os.Getenv("FENCE_TEST_TEMPLATES"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "fence-test-templates")
}

// requireTemplate makes sure template name is built; a missing base
// template is a skip outside CI and a failure under CI.
func requireTemplate(t testing.TB, name string) {
	t.Helper()
	testutil.RootFS(t, name)
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// newDataDir returns a data dir for a daemon below testutil.StateDir, which
// sandbox uids can traverse.
func newDataDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(testutil.StateDir(t), "data")
}

// startDaemon starts `fence serve` on dataDir, on a free port of 127.0.0.1,
// and waits until /health answers. At cleanup it is stopped with SIGTERM,
// must exit 0, and must leave no sandbox behind.
func startDaemon(t *testing.T, dataDir string, extra ...string) *daemon {
	t.Helper()
	testutil.RequireRoot(t)
	d := &daemon{t: t, DataDir: dataDir, Key: "e2b_" + randHex(20), out: &syncBuffer{}}
	t.Cleanup(func() {
		if d.cmd != nil && d.running() {
			d.Stop()
		}
		if t.Failed() {
			t.Logf("daemon output:\n%s", d.out.String())
		}
		unmountUnder(d.DataDir)
	})
	d.extra = extra
	d.start(extra...)
	return d
}

func (d *daemon) start(extra ...string) {
	t := d.t
	t.Helper()
	args := append([]string{"serve",
		"--addr", "127.0.0.1:0",
		"--data-dir", d.DataDir,
		"--templates-dir", templatesDir(t),
		// The warm pool's idle sandboxes would count as leftovers in the
		// checks; TestWarmPool turns it on.
		"--warm-pool", "0",
		"--warm-code-interpreter", "0",
	}, extra...)
	cmd := exec.Command(testutil.FenceBinary(t), args...)
	cmd.Env = append(os.Environ(), "FENCE_API_KEY="+d.Key)
	cmd.Stderr = d.out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting fence serve: %v", err)
	}
	d.cmd = cmd
	d.exited = make(chan struct{})
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			d.out.Write([]byte(line + "\n"))
			if _, rest, ok := strings.Cut(line, "serving the E2B API on "); ok {
				u, _, _ := strings.Cut(rest, " ")
				select {
				case urlc <- u:
				default:
				}
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() {
		d.waitErr = cmd.Wait()
		close(d.exited)
	}()
	select {
	case d.URL = <-urlc:
	case <-d.exited:
		t.Fatalf("fence serve exited before serving: %v\n%s", d.waitErr, d.out.String())
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("fence serve did not print its address within 60s:\n%s", d.out.String())
	}
	d.waitHealthy()
	d.Client = client.New(d.URL, d.Key, client.WithHTTPClient(httpClientFor(d.URL)))
}

// httpClientFor returns the HTTP client for a daemon at url: the default
// one, or for https one that trusts the tests' self-signed certificates.
func httpClientFor(url string) *http.Client {
	if !strings.HasPrefix(url, "https://") {
		return http.DefaultClient
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	tr.ForceAttemptHTTP2 = true
	return &http.Client{Transport: tr}
}

// waitHealthy polls GET /health until it answers 200.
func (d *daemon) waitHealthy() {
	t := d.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := httpClientFor(d.URL).Get(d.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusNoContent {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /health: %v (status %v)\n%s", err, resp, d.out.String())
		}
		select {
		case <-d.exited:
			t.Fatalf("fence serve exited: %v\n%s", d.waitErr, d.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (d *daemon) running() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and checks the daemon exits 0 and leaves no sandbox
// behind (TestShutdown checks that the daemon's own resources go too).
func (d *daemon) Stop() {
	t := d.t
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("SIGTERM to fence serve: %v", err)
	}
	select {
	case <-d.exited:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		t.Errorf("fence serve did not exit within 60s of SIGTERM")
	}
	if d.waitErr != nil {
		t.Errorf("fence serve after SIGTERM: %v, want exit status 0\n%s", d.waitErr, d.out.String())
	}
	assertNoSandboxLeftovers(t, d.DataDir, d.sandboxIDs(), nil)
}

var sandboxIDRe = regexp.MustCompile(`sandbox_id=([a-z0-9]+)`)

// sandboxIDs returns the IDs of every sandbox the daemon (any of its runs on
// this data dir) logged.
func (d *daemon) sandboxIDs() map[string]bool {
	ids := map[string]bool{}
	for _, m := range sandboxIDRe.FindAllStringSubmatch(d.out.String(), -1) {
		ids[m[1]] = true
	}
	return ids
}

// Crash kills the daemon with SIGKILL and waits for it to be gone.
func (d *daemon) Crash() {
	d.t.Helper()
	d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// Restart starts a new daemon process on the same data dir and key.
func (d *daemon) Restart() {
	d.t.Helper()
	if d.running() {
		d.t.Fatal("Restart of a running daemon")
	}
	d.start(d.extra...)
}

// create creates a sandbox of template with the daemon's client and kills
// it at cleanup (ignoring "not found").
func (d *daemon) create(t *testing.T, req api.NewSandbox) *client.Sandbox {
	t.Helper()
	if req.TemplateID == "" {
		req.TemplateID = "minimal"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb, err := d.Client.Create(ctx, req)
	if err != nil {
		t.Fatalf("Create(%s): %v", req.TemplateID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sb.Kill(ctx); err != nil && !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Kill(%s): %v", sb.ID(), err)
		}
	})
	return sb
}

// rawResponse is a raw HTTP answer of the daemon.
type rawResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

// do sends a raw request with key in X-API-Key ("" sends none) and extra
// headers.
func (d *daemon) do(t testing.TB, method, path, key string, body io.Reader, hdr map[string]string) rawResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, d.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(api.HeaderAPIKey, key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return rawResponse{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// run runs spec through e and returns stdout, stderr and the exit status.
func run(t testing.TB, e *client.Envd, spec client.ProcessSpec) (stdout, stderr string, st client.ExitStatus) {
	t.Helper()
	var out, errb bytes.Buffer
	spec.Stdout, spec.Stderr = &out, &errb
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := e.Run(ctx, spec)
	if err != nil {
		t.Fatalf("Run(%s %q): %v (stdout %q, stderr %q)", spec.Cmd, spec.Args, err, out.String(), errb.String())
	}
	return out.String(), errb.String(), st
}

// sh runs a shell script in the sandbox and fails t unless it exits 0.
func sh(t testing.TB, e *client.Envd, script string) string {
	t.Helper()
	out, errs, st := run(t, e, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", script}})
	if st.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d (%s), stderr %q", script, st.ExitCode, st.Status, errs)
	}
	return out
}

// fenceCLI runs the fence binary with args against the daemon (FENCE_URL
// and FENCE_API_KEY set) and returns stdout, stderr and the exit code.
func (d *daemon) fenceCLI(t testing.TB, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	return runFence(t, []string{"FENCE_URL=" + d.URL, "FENCE_API_KEY=" + d.Key}, stdin, args...)
}

// runFence runs the fence binary with args and extra environment.
func runFence(t testing.TB, env []string, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.FenceBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ctx.Err() != nil {
			t.Fatalf("fence %q: %v (stderr %q)", args, err, errb.String())
		}
		code = ee.ExitCode()
	}
	return out.String(), errb.String(), code
}

// --- host-side inspection ---

// cgroupRoots returns the directories under which fence creates the
// cgroups of instance: fence/<instance> in every v1 hierarchy, and in the
// v2 hierarchy (unified, or the root on a pure v2 host).
func cgroupRoots(inst string) []string {
	var roots []string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{filepath.Join("/sys/fs/cgroup", "fence", inst)}
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		if e.IsDir() {
			roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name(), "fence", inst))
		}
	}
	return roots
}

// sandboxCgroups lists the sandbox cgroup directories of instance. The
// backend's own groups (the ready inits' "_ready") are not sandboxes: their
// names are no sandbox ID.
func sandboxCgroups(inst string) []string {
	var dirs []string
	for _, r := range cgroupRoots(inst) {
		ents, _ := os.ReadDir(r)
		for _, e := range ents {
			if e.IsDir() && !strings.HasPrefix(e.Name(), "_") {
				dirs = append(dirs, filepath.Join(r, e.Name()))
			}
		}
	}
	return dirs
}

// hostProc identifies a host process across pid reuse.
type hostProc struct {
	PID       int
	StartTime string // field 22 of /proc/PID/stat
}

func procStartTime(pid int) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", false
	}
	// f[0] is field 3 (state); starttime is field 22.
	if f[0] == "Z" || f[0] == "X" {
		return "", false // a zombie is dead; only its parent's wait is missing
	}
	return f[19], true
}

// sandboxProcs returns the host processes in sandbox id's cgroups.
func sandboxProcs(t testing.TB, id string) []hostProc {
	t.Helper()
	seen := map[int]bool{}
	var procs []hostProc
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/fence/*")
	if v2, _ := filepath.Glob("/sys/fs/cgroup/fence/*"); len(v2) > 0 {
		roots = append(roots, v2...)
	}
	// A sandbox rebooted while its predecessor was released has its
	// cgroup under its key (see keyID).
	var dirs []string
	for _, r := range roots {
		rebooted, _ := filepath.Glob(filepath.Join(r, id+"r????????"))
		dirs = append(append(dirs, filepath.Join(r, id)), rebooted...)
	}
	for _, r := range dirs {
		filepath.WalkDir(r, func(p string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || de.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil || seen[pid] {
					continue
				}
				seen[pid] = true
				if st, ok := procStartTime(pid); ok {
					procs = append(procs, hostProc{PID: pid, StartTime: st})
				}
			}
			return nil
		})
	}
	return procs
}

// alive returns the processes of procs that still run.
func alive(procs []hostProc) []hostProc {
	var live []hostProc
	for _, p := range procs {
		if st, ok := procStartTime(p.PID); ok && st == p.StartTime {
			live = append(live, p)
		}
	}
	return live
}

// sandboxUIDProcs scans /proc for processes whose real uid is a sandbox uid
// (≥ 1<<24) and returns them with their cgroup lines.
func sandboxUIDProcs() map[int]string {
	found := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var uid int64 = -1
		state := ""
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 {
					uid, _ = strconv.ParseInt(f[0], 10, 64)
				}
			}
			if v, ok := strings.CutPrefix(line, "State:"); ok {
				state = strings.TrimSpace(v)
			}
		}
		if uid < sandboxUIDBase || strings.HasPrefix(state, "Z") {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		found[pid] = fmt.Sprintf("uid %d, state %s, cgroups %q", uid, state, strings.TrimSpace(string(cg)))
	}
	return found
}

// mountsUnder returns the mountinfo lines of this mount namespace whose
// mount point or source mention dir.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, dir) {
			lines = append(lines, l)
		}
	}
	return lines
}

// dirEntries lists the names in dir (none if it does not exist).
func dirEntries(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// assertNoLeftovers checks that nothing of the serve instance of a stopped
// daemon on dataDir remains: no sandbox (see assertNoSandboxLeftovers), no
// disk image or prepared disk, and no mount under dataDir. (The daemon's
// private self-mount of DATA/native/disk/<instance> stays only after a crash
// or while sandboxes remain; one such mount is tolerated.)
func assertNoLeftovers(t testing.TB, dataDir string, ours map[string]bool) {
	t.Helper()
	assertNoSandboxLeftovers(t, dataDir, ours, nil)
	instance := instanceOf(dataDir)
	native := filepath.Join(dataDir, "native")
	diskDir := filepath.Join(native, "disk", instance)
	var left []string
	for _, n := range dirEntries(filepath.Join(native, "images", instance)) {
		left = append(left, filepath.Join("images", instance, n))
	}
	for _, n := range dirEntries(diskDir) {
		if n != ".pool" && n != ".trash" {
			continue // sandbox layers: assertNoSandboxLeftovers
		}
		for _, m := range dirEntries(filepath.Join(diskDir, n)) {
			left = append(left, filepath.Join("disk", instance, n, m))
		}
	}
	if len(left) > 0 {
		t.Errorf("after the daemon exited, disks remain in %s: %q", native, left)
	}
	var mounts []string
	self := 0
	for _, m := range mountsUnder(dataDir) {
		if f := strings.Fields(m); len(f) >= 5 && f[4] == diskDir {
			self++
			if self == 1 {
				continue
			}
		}
		mounts = append(mounts, m)
	}
	if len(mounts) > 0 {
		t.Errorf("after the daemon exited, %d mounts under its data dir %s remain:\n%s", len(mounts), dataDir, strings.Join(mounts, "\n"))
	}
}

// assertNoSandboxLeftovers checks that none of the sandboxes in ours
// (those the daemon on dataDir made) remains unless it is in live: no
// cgroup, no process with a sandbox uid in its cgroup, and no state or
// socket entry, writable layer, disk image or mount in dataDir other than
// those of live sandboxes. (The fence/serve cgroup parent is shared by
// every daemon of the host, so cgroups are judged by sandbox ID.) A kill
// answers once the sandbox's processes are gone and releases the rest in
// the background, so the check allows that a few seconds.
func assertNoSandboxLeftovers(t testing.TB, dataDir string, ours, live map[string]bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := sandboxLeftovers(dataDir, ours, live)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, l := range left {
				t.Error(l)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// keyID is the sandbox ID a native host resource is named after: its
// name, or, for a sandbox booted under the ID of one still being released
// (a rewind), the name without the suffix "r" and 8 characters.
func keyID(name string) string {
	if len(name) == 29 && name[20] == 'r' {
		return name[:20]
	}
	return name
}

func sandboxLeftovers(dataDir string, ours, live map[string]bool) []string {
	var left []string
	instance := instanceOf(dataDir)
	for _, cg := range sandboxCgroups(instance) {
		if id := filepath.Base(cg); ours[id] && !live[id] {
			left = append(left, fmt.Sprintf("sandbox cgroup left: %s", cg))
		}
	}
	for pid, desc := range sandboxUIDProcs() {
		for id := range ours {
			if !live[id] && strings.Contains(desc, "/fence/"+instance+"/"+id) {
				left = append(left, fmt.Sprintf("process %d of sandbox %s left: %s", pid, id, desc))
			}
		}
	}
	native := filepath.Join(dataDir, "native")
	for _, d := range []string{"sandboxes", "sock", "disk", "images"} {
		for _, n := range dirEntries(filepath.Join(native, d, instance)) {
			id := keyID(strings.TrimSuffix(strings.TrimSuffix(n, ".sock"), ".img"))
			if strings.HasPrefix(n, ".") || live[id] {
				continue
			}
			left = append(left, fmt.Sprintf("sandbox leftover %s", filepath.Join(native, d, instance, n)))
		}
	}
	// The btrfs layer store's subvolumes (its mount is the daemon's own).
	for _, n := range dirEntries(filepath.Join(native, "layerfs", "sandboxes", instance)) {
		if !live[keyID(n)] {
			left = append(left, fmt.Sprintf("sandbox leftover subvolume %s", n))
		}
	}
	for _, m := range mountsUnder(dataDir) {
		f := strings.Fields(m)
		if len(f) < 5 {
			continue
		}
		mp := f[4]
		if mp == filepath.Join(native, "layerfs") {
			continue
		}
		rel, err := filepath.Rel(filepath.Join(native, "disk", instance), mp)
		if err != nil || rel == "." || strings.HasPrefix(rel, ".pool/") || strings.HasPrefix(rel, ".trash/") || live[keyID(rel)] {
			continue // the disk pool, or a live sandbox's layer
		}
		left = append(left, fmt.Sprintf("mount left under the data dir: %s", m))
	}
	return left
}

// unmountUnder detaches every mount under dir, deepest first, so that a
// failed test does not leak loop devices and its temporary dir can go.
func unmountUnder(dir string) {
	var mps []string
	for _, m := range mountsUnder(dir) {
		if f := strings.Fields(m); len(f) >= 5 && strings.HasPrefix(f[4], dir) {
			mps = append(mps, f[4])
		}
	}
	slices.SortFunc(mps, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range mps {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}

// eventually polls cond every 20ms until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ctxT returns a context bounded to a minute for one step of a test.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
