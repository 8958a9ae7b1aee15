package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// startSleeper starts `sleep 1000` in sb, detaches from it and returns the
// sandbox's host processes (agent, sleep, …), which must not be empty.
func startSleeper(t *testing.T, sb *client.Sandbox) []hostProc {
	t.Helper()
	ctx := ctxT(t)
	p, err := sb.Envd().Start(context.WithoutCancel(ctx), client.ProcessSpec{Cmd: "sleep", Args: []string{"1000"}})
	if err != nil {
		t.Fatalf("starting sleep 1000 in %s: %v", sb.ID(), err)
	}
	p.Close()
	procs := sandboxProcs(t, sb.ID())
	if len(procs) < 2 {
		t.Fatalf("host processes of sandbox %s = %v, want at least the agent and sleep", sb.ID(), procs)
	}
	return procs
}

// TestDeadline proves that a sandbox whose timeout passes is killed by the
// daemon: Get answers 404 and its processes and cgroups are gone. Root: the
// daemon creates namespaces, cgroups and mounts.
func TestDeadline(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	two := int32(2)
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal", Timeout: &two})
	procs := startSleeper(t, sb)
	got, err := d.Client.Get(ctxT(t), sb.ID())
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if ttl := got.EndAt.Sub(got.StartedAt); ttl < time.Second || ttl > 3*time.Second {
		t.Errorf("endAt - startedAt = %v, want the 2s timeout", ttl)
	}
	eventually(t, 30*time.Second, "Get of the expired sandbox answers 404", func() bool {
		_, err := d.Client.Get(ctxT(t), sb.ID())
		return errors.Is(err, api.ErrNotFound)
	})
	eventually(t, 10*time.Second, "processes of the expired sandbox gone", func() bool { return len(alive(procs)) == 0 })
	// Get answers 404 as soon as the kill starts; the host resources are
	// released a few milliseconds later.
	eventually(t, 10*time.Second, "state of the expired sandbox removed", func() bool {
		_, err := os.Stat(filepath.Join(d.DataDir, "native", "sandboxes", instanceOf(d.DataDir), sb.ID()))
		return os.IsNotExist(err)
	})
	ids := map[string]bool{sb.ID(): true}
	assertNoSandboxLeftovers(t, d.DataDir, ids, nil)
	list, err := d.Client.List(ctxT(t), client.ListOptions{})
	if err != nil || len(list) != 0 {
		t.Errorf("List after the deadline = %q, %v; want none", listedIDs(list), err)
	}
}

// TestCrashRecovery proves that after `kill -9` of the daemon, the next
// start on the same data dir kills and removes every sandbox the crashed
// one left (processes, cgroups, state, writable layers, mounts), reports
// them gone, and serves new sandboxes. Root: the daemon creates namespaces,
// cgroups and mounts, and the test reads other users' /proc entries.
func TestCrashRecovery(t *testing.T) {
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	var old []*client.Sandbox
	var procs []hostProc
	for range 3 {
		sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		old = append(old, sb)
		procs = append(procs, startSleeper(t, sb)...)
	}
	d.Crash()
	survivors := alive(procs)
	t.Logf("after kill -9 of the daemon, %d of %d sandbox processes still run", len(survivors), len(procs))

	d.Restart()
	// The daemon guarantees the cleanup is done before the API answers.
	if live := alive(procs); len(live) > 0 {
		t.Errorf("processes of the crashed daemon's sandboxes still run after restart: %v", live)
	}
	for _, sb := range old {
		if _, err := d.Client.Get(ctxT(t), sb.ID()); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("Get(%s) after restart = %v, want 404", sb.ID(), err)
		}
		if _, err := sb.Envd().Stat(ctxT(t), "/"); err == nil {
			t.Errorf("envd of %s still answers after restart", sb.ID())
		}
	}
	list, err := d.Client.List(ctxT(t), client.ListOptions{})
	if err != nil || len(list) != 0 {
		t.Errorf("List after restart = %q, %v; want none", listedIDs(list), err)
	}
	assertNoSandboxLeftovers(t, dataDir, d.sandboxIDs(), nil)

	// New sandboxes work; one is left running for the SIGTERM at cleanup,
	// which must kill it.
	sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatalf("Create after restart: %v", err)
	}
	if out := sh(t, sb.Envd(), "echo alive"); out != "alive\n" {
		t.Errorf("new sandbox after restart: %q", out)
	}
	startSleeper(t, sb)
	assertNoSandboxLeftovers(t, dataDir, d.sandboxIDs(), map[string]bool{sb.ID(): true})
}

// TestConcurrentCreates proves that 50 sandboxes created at once through
// the API all work and that killing them all leaves nothing. Root: the
// daemon creates namespaces, cgroups and mounts.
// TestCrashDuringRelease: a kill answers once the sandbox's processes are
// gone and releases its cgroup, writable layer and state in the background.
// A daemon killed with -9 right after such kills leaves those releases
// half done; the next start must finish them.
func TestCrashDuringRelease(t *testing.T) {
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	var sbs []*client.Sandbox
	for range 6 {
		sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		sbs = append(sbs, sb)
	}
	var wg sync.WaitGroup
	for _, sb := range sbs {
		wg.Go(func() {
			if err := sb.Kill(ctxT(t)); err != nil {
				t.Errorf("Kill(%s): %v", sb.ID(), err)
			}
		})
	}
	wg.Wait()
	left := len(sandboxLeftovers(dataDir, d.sandboxIDs(), nil))
	d.Crash()
	t.Logf("host resources still held when the daemon was killed: %d", left)
	d.Restart()
	assertNoSandboxLeftovers(t, dataDir, d.sandboxIDs(), nil)
	if out := sh(t, d.create(t, api.NewSandbox{TemplateID: "minimal"}).Envd(), "echo ok"); out != "ok\n" {
		t.Errorf("new sandbox after restart: %q", out)
	}
}

func TestConcurrentCreates(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	const n = 50
	tag := randHex(6)
	sbs := make([]*client.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal", Metadata: map[string]string{"batch": tag}, EnvVars: map[string]string{"N": strconv.Itoa(i)}})
			if err != nil {
				errs[i] = err
				return
			}
			sbs[i] = sb
			var out bytes.Buffer
			st, err := sb.Envd().Run(ctx, client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "echo $N"}, Stdout: &out})
			if err != nil || st.ExitCode != 0 || out.String() != strconv.Itoa(i)+"\n" {
				errs[i] = fmt.Errorf("echo $N in sandbox %d: %q, %+v, %v", i, out.String(), st, err)
			}
		})
	}
	wg.Wait()
	created := 0
	for i, err := range errs {
		if err != nil {
			t.Errorf("sandbox %d: %v", i, err)
		}
		if sbs[i] != nil {
			created++
		}
	}
	list, err := d.Client.List(ctxT(t), client.ListOptions{Metadata: map[string]string{"batch": tag}})
	if err != nil || len(list) != created || created != n {
		t.Errorf("List(batch) = %d sandboxes, %v; created %d, want %d", len(list), err, created, n)
	}
	// Distinct IDs, and no two sandboxes share a host uid.
	seen := map[string]bool{}
	uidOwner := map[int]string{}
	for _, sb := range sbs {
		if sb == nil {
			continue
		}
		if seen[sb.ID()] {
			t.Errorf("duplicate sandbox ID %s", sb.ID())
		}
		seen[sb.ID()] = true
		uids := hostUIDs(sandboxProcs(t, sb.ID()))
		if len(uids) == 0 {
			t.Errorf("sandbox %s has no process with a sandbox uid", sb.ID())
		}
		for u := range uids {
			if other, ok := uidOwner[u]; ok {
				t.Errorf("sandboxes %s and %s share host uid %d", other, sb.ID(), u)
			}
			uidOwner[u] = sb.ID()
		}
	}
	for _, sb := range sbs {
		if sb == nil {
			continue
		}
		wg.Go(func() {
			if err := sb.Kill(ctxT(t)); err != nil {
				t.Errorf("Kill(%s): %v", sb.ID(), err)
			}
		})
	}
	wg.Wait()
	list, err = d.Client.List(ctxT(t), client.ListOptions{})
	if err != nil || len(list) != 0 {
		t.Errorf("List after killing all = %d sandboxes, %v; want none", len(list), err)
	}
	assertNoSandboxLeftovers(t, d.DataDir, d.sandboxIDs(), nil)
}

// TestBadInput proves that malformed or unauthorized requests get a clear
// JSON error with the right status and create nothing. Root: the daemon
// creates namespaces, cgroups and mounts.
func TestBadInput(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	type apiError struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	check := func(t *testing.T, name string, r rawResponse, lo, hi int, mention string) {
		t.Helper()
		if r.Status < lo || r.Status > hi {
			t.Errorf("%s: status %d (%s), want %d..%d", name, r.Status, r.Body, lo, hi)
			return
		}
		var e apiError
		if err := json.Unmarshal(r.Body, &e); err != nil || e.Code == nil || e.Message == nil {
			t.Errorf("%s: body %q, want {\"code\",\"message\"}", name, r.Body)
			return
		}
		if *e.Code != r.Status || *e.Message == "" {
			t.Errorf("%s: body %q, want code %d and a message", name, r.Body, r.Status)
		}
		if mention != "" && !strings.Contains(strings.ToLower(*e.Message), strings.ToLower(mention)) {
			t.Errorf("%s: message %q does not mention %q", name, *e.Message, mention)
		}
	}
	post := func(body string) rawResponse {
		return d.do(t, "POST", "/v2/sandboxes", d.Key, strings.NewReader(body), nil)
	}
	t.Run("create", func(t *testing.T) {
		for _, tc := range []struct {
			name, body string
			lo, hi     int
			mention    string
		}{
			{"unknown template", `{"templateID":"nosuchtemplate"}`, 400, 404, "nosuchtemplate"},
			{"template path traversal", `{"templateID":"../../../etc"}`, 400, 404, ""},
			{"empty template", `{"templateID":""}`, 400, 404, ""},
			{"negative memory", `{"templateID":"minimal","memoryMB":-1}`, 400, 400, "memory"},
			{"zero cpu", `{"templateID":"minimal","cpuCount":0}`, 400, 400, "cpu"},
			{"negative cpu", `{"templateID":"minimal","cpuCount":-2}`, 400, 400, "cpu"},
			{"huge cpu", `{"templateID":"minimal","cpuCount":1000000}`, 400, 400, "cpu"},
			{"huge memory", `{"templateID":"minimal","memoryMB":1099511627776}`, 400, 400, "memory"},
			{"huge disk", `{"templateID":"minimal","diskSizeMB":1099511627776}`, 400, 400, "disk"},
			{"negative timeout", `{"templateID":"minimal","timeout":-5}`, 400, 400, "timeout"},
			{"malformed JSON", `{"templateID":`, 400, 400, ""},
			{"wrong type", `{"templateID":5}`, 400, 400, ""},
			{"not an object", `[1,2,3]`, 400, 400, ""},
			{"oversized body", `{"templateID":"minimal","metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`, 413, 413, ""},
		} {
			check(t, tc.name, post(tc.body), tc.lo, tc.hi, tc.mention)
		}
	})
	t.Run("auth", func(t *testing.T) {
		body := `{"templateID":"minimal"}`
		for _, key := range []string{"", "e2b_" + randHex(20), d.Key + "x", strings.ToUpper(d.Key)} {
			r := d.do(t, "POST", "/v2/sandboxes", key, strings.NewReader(body), nil)
			check(t, fmt.Sprintf("create with key %q", key), r, 401, 401, "")
			r = d.do(t, "GET", "/v2/sandboxes", key, nil, nil)
			check(t, fmt.Sprintf("list with key %q", key), r, 401, 401, "")
		}
		// /health needs no key.
		if r := d.do(t, "GET", "/health", "", nil, nil); r.Status >= 300 {
			t.Errorf("GET /health without a key = %d", r.Status)
		}
	})
	t.Run("unknown sandbox", func(t *testing.T) {
		check(t, "GET /sandboxes/nosuch", d.do(t, "GET", "/sandboxes/nosuch", d.Key, nil, nil), 404, 404, "")
		check(t, "DELETE /sandboxes/nosuch", d.do(t, "DELETE", "/sandboxes/nosuch", d.Key, nil, nil), 404, 404, "")
		check(t, "POST /sandboxes/nosuch/timeout", d.do(t, "POST", "/sandboxes/nosuch/timeout", d.Key, strings.NewReader(`{"timeout":10}`), nil), 404, 404, "")
		check(t, "GET /sandboxes/../../etc", d.do(t, "GET", "/sandboxes/..%2F..%2Fetc", d.Key, nil, nil), 400, 404, "")
		// Sandbox traffic for an unknown sandbox: 502 with the proxy error.
		r := d.do(t, "GET", "/files?path=/etc/passwd", "", nil, map[string]string{api.HeaderSandboxID: "nosuch", api.HeaderSandboxPort: "49983"})
		var pe api.ProxyError
		if r.Status != 502 || json.Unmarshal(r.Body, &pe) != nil || pe.SandboxID != "nosuch" {
			t.Errorf("envd traffic for an unknown sandbox = %d %q, want 502 with sandboxId", r.Status, r.Body)
		}
	})
	t.Run("bad requests on a live sandbox", func(t *testing.T) {
		sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
		check(t, "timeout malformed", d.do(t, "POST", "/sandboxes/"+sb.ID()+"/timeout", d.Key, strings.NewReader(`{"timeout":`), nil), 400, 400, "")
		check(t, "timeout negative", d.do(t, "POST", "/sandboxes/"+sb.ID()+"/timeout", d.Key, strings.NewReader(`{"timeout":-1}`), nil), 400, 400, "")
		check(t, "list bad limit", d.do(t, "GET", "/v2/sandboxes?limit=-3", d.Key, nil, nil), 400, 400, "limit")
		// The sandbox is unharmed.
		if out := sh(t, sb.Envd(), "echo ok"); out != "ok\n" {
			t.Errorf("sandbox after bad requests: %q", out)
		}
		if err := sb.Kill(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	})
	// Nothing was created by the refused requests.
	if ids := d.sandboxIDs(); len(ids) != 1 {
		t.Errorf("sandboxes created during the bad-input test: %v, want only the one live-sandbox test's", ids)
	}
	list, err := d.Client.List(ctxT(t), client.ListOptions{})
	if err != nil || len(list) != 0 {
		t.Errorf("List after bad input = %q, %v; want none", listedIDs(list), err)
	}
	assertNoSandboxLeftovers(t, d.DataDir, d.sandboxIDs(), nil)
}

// TestTwoDaemons proves that two daemons on different data dirs of one
// host do not disturb each other: starting the second must not kill the
// first one's sandboxes, and their sandboxes must not share host uids.
// Root: the daemons create namespaces, cgroups and mounts, and the test
// reads other users' /proc entries.
func TestTwoDaemons(t *testing.T) {
	a := startDaemon(t, newDataDir(t))
	sa := a.create(t, api.NewSandbox{TemplateID: "minimal"})
	procsA := startSleeper(t, sa)
	uidsA := hostUIDs(procsA)
	b := startDaemon(t, newDataDir(t))
	sb := b.create(t, api.NewSandbox{TemplateID: "minimal"})
	procsB := startSleeper(t, sb)

	if live := alive(procsA); len(live) != len(procsA) {
		t.Errorf("starting a second daemon on another data dir killed %d of %d processes of the first daemon's sandbox %s", len(procsA)-len(live), len(procsA), sa.ID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	if st, err := sa.Envd().Run(ctx, client.ProcessSpec{Cmd: "echo", Args: []string{"a"}, Stdout: &out}); err != nil || st.ExitCode != 0 || out.String() != "a\n" {
		t.Errorf("first daemon's sandbox after the second daemon started: %q, %+v, %v; want it working", out.String(), st, err)
	}
	uidsB := hostUIDs(procsB)
	for u := range uidsA {
		if uidsB[u] {
			t.Errorf("sandboxes %s (daemon A) and %s (daemon B) share host uid %d", sa.ID(), sb.ID(), u)
		}
	}
}

// hostUIDs returns the real host uids of procs that still run.
func hostUIDs(procs []hostProc) map[int]bool {
	uids := map[int]bool{}
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.PID), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					u, _ := strconv.Atoi(f[0])
					if u >= sandboxUIDBase {
						uids[u] = true
					}
				}
			}
		}
	}
	return uids
}

// TestShutdown proves that SIGTERM stops the daemon cleanly: it exits 0,
// kills the sandboxes still running, and leaves nothing on the host: no
// process, cgroup, state, disk image, loop device or mount under its data
// dir. Root: the daemon creates namespaces, cgroups and mounts.
func TestShutdown(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	var procs []hostProc
	for range 2 {
		sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"})
		if err != nil {
			t.Fatalf("Create: %v", err)
		}
		procs = append(procs, startSleeper(t, sb)...)
	}
	d.Stop()
	if live := alive(procs); len(live) > 0 {
		t.Errorf("sandbox processes still run after the daemon exited: %v", live)
	}
	assertNoLeftovers(t, d.DataDir, d.sandboxIDs())
	// A second daemon can take the data dir over at once.
	d.Restart()
	if out := sh(t, d.create(t, api.NewSandbox{TemplateID: "minimal"}).Envd(), "echo ok"); out != "ok\n" {
		t.Errorf("sandbox of the restarted daemon: %q", out)
	}
	// Restarts do not stack mounts.
	diskDir := filepath.Join(d.DataDir, "native", "disk", instanceOf(d.DataDir))
	n := 0
	for _, m := range mountsUnder(diskDir) {
		if f := strings.Fields(m); len(f) >= 5 && f[4] == diskDir {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d mounts on %s after a restart, want 1", n, diskDir)
	}
}

// TestSandboxDiesOutside proves that the daemon notices a sandbox whose
// processes die behind its back (the OOM killer, an operator's kill -9):
// it is reported gone and its host resources are removed. Root: the daemon
// creates namespaces, cgroups and mounts, and the test kills sandbox
// processes on the host.
func TestSandboxDiesOutside(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	procs := startSleeper(t, sb)
	for _, p := range procs {
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
	eventually(t, 10*time.Second, "processes of the sandbox gone after kill -9", func() bool { return len(alive(procs)) == 0 })
	eventually(t, 30*time.Second, "Get of the dead sandbox answers 404", func() bool {
		_, err := d.Client.Get(ctxT(t), sb.ID())
		return errors.Is(err, api.ErrNotFound)
	})
	eventually(t, 10*time.Second, "host resources of the dead sandbox removed", func() bool {
		for _, cg := range sandboxCgroups(instanceOf(d.DataDir)) {
			if filepath.Base(cg) == sb.ID() {
				return false
			}
		}
		_, err := os.Stat(filepath.Join(d.DataDir, "native", "sandboxes", instanceOf(d.DataDir), sb.ID()))
		return os.IsNotExist(err)
	})
	assertNoSandboxLeftovers(t, d.DataDir, d.sandboxIDs(), nil)
	// The daemon is fine and creates new sandboxes.
	if out := sh(t, d.create(t, api.NewSandbox{TemplateID: "minimal"}).Envd(), "echo ok"); out != "ok\n" {
		t.Errorf("new sandbox after one died: %q", out)
	}
}

// TestWarmPool proves that sandboxes handed out from the warm pool behave
// like fresh ones: the create's env vars reach them, they run as the
// default user, no two requests get the same sandbox, and the pool leaves
// nothing behind at shutdown. Root: the daemon creates namespaces,
// cgroups and mounts.
func TestWarmPool(t *testing.T) {
	requireTemplate(t, "base") // the pool keeps the default template, base
	d := startDaemon(t, newDataDir(t), "--warm-pool", "2")
	eventually(t, 60*time.Second, "the warm pool fills", func() bool { return len(hostSandboxes(d.DataDir)) == 2 })
	// (A pooled sandbox's cgroup appears while it still boots, so not
	// every create below need find it ready.)
	pooled := map[string]int{}
	for id := range hostSandboxes(d.DataDir) {
		pooled[id] = 1
	}
	fromPool := 0
	seen := map[string]bool{}
	for i := range 4 {
		sb := d.create(t, api.NewSandbox{TemplateID: "base", EnvVars: map[string]string{"N": strconv.Itoa(i)}})
		fromPool += pooled[sb.ID()]
		if seen[sb.ID()] {
			t.Fatalf("sandbox %s handed out twice", sb.ID())
		}
		seen[sb.ID()] = true
		if out := sh(t, sb.Envd(), `echo "$N $(id -un) $(hostname)"`); out != fmt.Sprintf("%d user %s\n", i, sb.ID()) {
			t.Errorf("sandbox %d from the pool: %q", i, out)
		}
	}
	if fromPool == 0 {
		t.Errorf("no create was served from the pool %v", pooled)
	}
}
