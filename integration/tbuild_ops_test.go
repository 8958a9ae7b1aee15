package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// listedWithMeta lists sandboxes through the API (path with its query) and
// returns their IDs with their metadata.
func listedWithMeta(t *testing.T, d *daemon, path string) map[string]map[string]string {
	t.Helper()
	r := d.do(t, "GET", path, d.Key, nil, nil)
	if r.Status != 200 {
		t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
	}
	var list []api.ListedSandbox
	if err := json.Unmarshal(r.Body, &list); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	out := map[string]map[string]string{}
	for _, s := range list {
		out[s.SandboxID] = s.Metadata
	}
	return out
}

// A template build's sandboxes are left out of the API's sandbox lists,
// as E2B's are, while they run: GET /sandboxes and /v2/sandboxes do not
// show them, includeBuilds=true and a metadata filter on the build key
// do; a user's create cannot take the key to hide a sandbox.
func TestTemplateBuildSandboxesHidden(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	user := d.create(t, api.NewSandbox{TemplateID: "minimal"})

	spec := client.TemplateBuildSpec{FromTemplate: "minimal", Steps: steps("sleep 4")}
	tid, bid := buildTemplate(t, d, "hidden", spec)
	// Wait for the build sandbox to exist.
	var buildSB string
	deadline := time.Now().Add(60 * time.Second)
	for buildSB == "" && time.Now().Before(deadline) {
		for id, md := range listedWithMeta(t, d, "/v2/sandboxes?includeBuilds=true") {
			if md["fence.template-build"] == bid {
				buildSB = id
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if buildSB == "" {
		t.Fatal("no sandbox with metadata fence.template-build in GET /v2/sandboxes?includeBuilds=true while the build runs")
	}
	for _, p := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running,paused", "/v2/sandboxes?includeBuilds=false"} {
		got := listedWithMeta(t, d, p)
		if _, ok := got[buildSB]; ok {
			t.Errorf("GET %s lists the build sandbox %s", p, buildSB)
		}
		if _, ok := got[user.ID()]; !ok {
			t.Errorf("GET %s does not list the user's sandbox %s", p, user.ID())
		}
	}
	for _, p := range []string{"/sandboxes?includeBuilds=true", "/v2/sandboxes?metadata=fence.template-build%3D" + bid} {
		if _, ok := listedWithMeta(t, d, p)[buildSB]; !ok {
			t.Errorf("GET %s does not list the build sandbox %s", p, buildSB)
		}
	}
	if r := d.do(t, "GET", "/v2/sandboxes?includeBuilds=yes", d.Key, nil, nil); r.Status != 400 {
		t.Errorf("includeBuilds=yes: %d %s, want 400", r.Status, r.Body)
	}
	r := d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(`{"templateID":"minimal","metadata":{"fence.template-build":"x"}}`), nil)
	if r.Status != 400 || !strings.Contains(string(r.Body), "reserved") {
		t.Errorf("create with the build metadata key: %d %s, want 400 reserved", r.Status, r.Body)
	}
	st, logs := waitBuild(t, d, tid, bid)
	if st.Status != "ready" {
		t.Fatalf("build: %s (%+v)\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
}

// treeSet lists the layer trees of a daemon's template builds.
func treeSet(dataDir string) map[string]bool {
	out := map[string]bool{}
	for _, n := range dirEntries(filepath.Join(dataDir, "builds", "trees")) {
		if !strings.HasPrefix(n, ".tmp-") { // being removed
			out[n] = true
		}
	}
	return out
}

// createOnce creates a sandbox the test kills itself (the harness's
// cleanup would use a client of a daemon restarted since).
func createOnce(t *testing.T, d *daemon, tmpl string) *client.Sandbox {
	t.Helper()
	sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: tmpl})
	if err != nil {
		t.Fatalf("Create(%s): %v", tmpl, err)
	}
	return sb
}

func deleteTemplate(t *testing.T, d *daemon, name string) {
	t.Helper()
	if r := d.do(t, "DELETE", "/templates/"+name, d.Key, nil, nil); r.Status != 204 {
		t.Fatalf("DELETE /templates/%s: %d %s", name, r.Status, r.Body)
	}
}

// Deleting a template removes its layer trees and cache entries that no
// other template uses, keeps the ones another template's build went
// through, and the collection at start removes what a crash left: trees
// and cache entries no record names, half-removed trees. A deleted
// template's trees stay while a live sandbox names it.
func TestTemplateBuildGC(t *testing.T) {
	requireTemplate(t, "minimal")
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	build := func(name, from string, cmds ...string) {
		t.Helper()
		tid, bid := buildTemplate(t, d, name, client.TemplateBuildSpec{FromTemplate: from, Steps: steps(cmds...)})
		if st, logs := waitBuild(t, d, tid, bid); st.Status != "ready" {
			t.Fatalf("build %s: %s %+v\n%s", name, st.Status, st.Reason, strings.Join(logs, "\n"))
		}
	}
	build("gc-a", "minimal", "echo a > /a")
	afterA := treeSet(dataDir)
	build("gc-b", "gc-a", "echo b > /b")
	afterB := treeSet(dataDir)
	build("gc-c", "minimal", "echo a > /a", "echo c > /c") // shares gc-a's layers through the cache
	all := treeSet(dataDir)
	var own []string // gc-b's own trees
	for n := range afterB {
		if !afterA[n] {
			own = append(own, n)
		}
	}
	if len(afterA) < 2 || len(own) < 2 || len(all) <= len(afterB) {
		t.Fatalf("trees: %d after gc-a, %d after gc-b, %d after gc-c", len(afterA), len(afterB), len(all))
	}

	// gc-a's trees stay: gc-b was built on it and gc-c went through them.
	deleteTemplate(t, d, "gc-a")
	if got := treeSet(dataDir); len(got) != len(all) {
		t.Errorf("deleting gc-a removed trees others use: %d left of %d", len(got), len(all))
	}
	sb := createOnce(t, d, "gc-b")
	if out := sh(t, sb.Envd(), "cat /a /b"); out != "a\nb\n" {
		t.Errorf("gc-b after deleting gc-a: %q", out)
	}
	if err := sb.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	deleteTemplate(t, d, "gc-b")
	got := treeSet(dataDir)
	for _, n := range own {
		if got[n] {
			t.Errorf("deleting gc-b left its tree %s", n)
		}
	}
	for n := range afterA {
		if !got[n] {
			t.Errorf("deleting gc-b removed %s, a layer gc-c went through", n)
		}
	}
	sc := createOnce(t, d, "gc-c")
	if out := sh(t, sc.Envd(), "cat /a /c"); out != "a\nc\n" {
		t.Errorf("gc-c: %q", out)
	}
	if err := sc.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// What a crash leaves is collected at start.
	trees, keys := filepath.Join(dataDir, "builds", "trees"), filepath.Join(dataDir, "builds", "layers")
	for _, n := range []string{"l-orphan", ".tmp-gc-l-half"} {
		if err := os.MkdirAll(filepath.Join(trees, n, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	orphanKey := filepath.Join(keys, strings.Repeat("ab", 32)+".json")
	if err := os.WriteFile(orphanKey, []byte(`{"tree":"l-orphan","ctx":{"user":"root","shell":"/bin/sh"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Crash()
	d.Restart()
	got = treeSet(dataDir)
	if _, err := os.Stat(filepath.Join(trees, ".tmp-gc-l-half")); got["l-orphan"] || err == nil {
		t.Errorf("after the restart, trees no record names remain: %v", got)
	}
	if _, err := os.Stat(orphanKey); err == nil {
		t.Errorf("after the restart, the cache entry of a removed tree remains")
	}
	if len(got) != len(all)-len(own) {
		t.Errorf("after the restart %d trees, want gc-c's %d", len(got), len(all)-len(own))
	}

	// A deleted template's trees stay while a live sandbox names it (its
	// tombstone, as a crash right after the deletion leaves it).
	live := createOnce(t, d, "minimal")
	if err := os.MkdirAll(filepath.Join(trees, "l-tomb", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dataDir, "builds", "deleted.json"), []byte(`[{"id":"tombid","alias":"minimal","trees":["l-tomb"]}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	deleteTemplate(t, d, "gc-c")
	if got := treeSet(dataDir); len(got) != 1 || !got["l-tomb"] {
		t.Errorf("after deleting gc-c with a live sandbox of a tombstoned name: trees %v, want only l-tomb", got)
	}
	if err := live.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	d.Stop()
	d.Restart()
	if got := treeSet(dataDir); len(got) != 0 {
		t.Errorf("after deleting every template and the last sandbox, trees remain: %v", got)
	}
	for _, n := range dirEntries(keys) {
		j, _ := os.ReadFile(filepath.Join(keys, n))
		if !strings.Contains(string(j), `"tree":"/`) {
			t.Errorf("after deleting every template, cache entry %s remains: %s", n, j)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "builds", "deleted.json")); err == nil {
		t.Errorf("the tombstone outlived its last sandbox")
	}
}

// A template's start and ready commands run once at the end of its build,
// as in E2B's finalize phase: a start command that fails before its ready
// command passes fails the build (step "finalize") and makes no template.
func TestTemplateBuildFinalizeStartCmd(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	tid, bid := buildTemplate(t, d, "fin-bad", client.TemplateBuildSpec{FromTemplate: "base", Steps: steps("echo x > /opt/x"),
		StartCmd: "echo starting; exit 3", ReadyCmd: "false"})
	st, logs := waitBuild(t, d, tid, bid)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "finalize" || !strings.Contains(st.Reason.Message, "start command failed: exit status 3") {
		t.Errorf("a failing start command: build %s %+v, want error at finalize (start command failed: exit status 3)\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	if _, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "fin-bad"}); err == nil {
		t.Errorf("a sandbox of the failed build was created")
	}

	tid, bid = buildTemplate(t, d, "fin-good", client.TemplateBuildSpec{FromTemplate: "base",
		StartCmd: "sleep 1 && echo up > /tmp/up && sleep infinity", ReadyCmd: "[ -f /tmp/up ]"})
	st, logs = waitBuild(t, d, tid, bid)
	if st.Status != "ready" {
		t.Fatalf("build %s %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	if !strings.Contains(strings.Join(logs, "\n"), "finalize ready in") {
		t.Errorf("no finalize run in the build log:\n%s", strings.Join(logs, "\n"))
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "fin-good"})
	if out := sh(t, sb.Envd(), "cat /tmp/up"); out != "up\n" {
		t.Errorf("the start command did not run at create: %q", out)
	}
}

// A build sandbox, hidden from the lists, still counts for
// --max-sandboxes: while it runs, a create of a daemon limited to one
// sandbox is refused (429), and admitted once the build is over.
func TestTemplateBuildSandboxesCounted(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t), "--max-sandboxes", "1", "--warm-pool", "0")
	tid, bid := buildTemplate(t, d, "counted", client.TemplateBuildSpec{FromTemplate: "minimal", Steps: steps("sleep 5")})
	eventually(t, time.Minute, "the build sandbox runs", func() bool {
		return len(listedWithMeta(t, d, "/v2/sandboxes?includeBuilds=true")) == 1
	})
	r := d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(`{"templateID":"minimal"}`), nil)
	if r.Status != 429 {
		t.Errorf("create while the build sandbox holds the only slot: %d %s, want 429", r.Status, r.Body)
		if r.Status == 201 {
			var sb api.Sandbox
			if json.Unmarshal(r.Body, &sb) == nil {
				d.do(t, "DELETE", "/sandboxes/"+sb.SandboxID, d.Key, nil, nil)
			}
		}
	}
	if st, logs := waitBuild(t, d, tid, bid); st.Status != "ready" {
		t.Fatalf("build: %s %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	eventually(t, time.Minute, "the slot is free after the build", func() bool {
		sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "counted"})
		if err != nil {
			return false
		}
		_ = sb.Kill(ctxT(t))
		return true
	})
}
