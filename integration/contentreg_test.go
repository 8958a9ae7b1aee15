package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// treeNames lists a node's template trees (DATA-DIR/builds/trees).
func treeNames(t *testing.T, d *daemon) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(d.DataDir, "builds", "trees"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// listedTemplates is GET /templates on d: template IDs by alias.
func listedTemplates(t *testing.T, d *daemon) map[string]string {
	t.Helper()
	r := d.do(t, "GET", "/templates", d.Key, nil, nil)
	var list []struct {
		TemplateID string   `json:"templateID"`
		Aliases    []string `json:"aliases"`
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &list) != nil {
		t.Fatalf("GET /templates = %d %s", r.Status, r.Body)
	}
	out := map[string]string{}
	for _, l := range list {
		for _, a := range l.Aliases {
			out[a] = l.TemplateID
		}
	}
	return out
}

// TestTemplatesThroughRegistry runs two nodes on one PostgreSQL database
// and one content registry: a template built through the API on node A
// (and one through `fence template build -f`) starts sandboxes on node B
// with A's files, every node lists them alike, concurrent creates on B
// pull once, a registry serving other bytes is refused and leaves nothing
// on B, a rebuild on B reaches A, a node whose registry is unreachable
// fails its build clearly, and a template deleted through B is gone from
// A at its next use. It logs the first start on a node that must pull
// against one that has the template.
func TestTemplatesThroughRegistry(t *testing.T) {
	testutil.RequireRoot(t)
	requireTemplate(t, "base")
	dsn := pgtest.New(t).Database(t)
	key := clusterKey(t)
	cr := startRegistry(t)
	flags := []string{"--database", dsn, "--secrets-key", key, "--registry", cr.URL}
	a := startDaemon(t, filepath.Join(testutil.StateDir(t), "a"), flags...)
	b := startDaemon(t, filepath.Join(testutil.StateDir(t), "b"), flags...)

	marker := randHex(16)
	tid, bid := buildTemplate(t, a, "shared-tpl", client.TemplateBuildSpec{FromTemplate: "base",
		Steps: steps("echo " + marker + " > /opt/marker && ln /opt/marker /opt/marker-link && head -c 8388608 /dev/urandom > /opt/blob && sha256sum /opt/blob > /opt/blob.sum")})
	if st, logs := waitBuild(t, a, tid, bid); st.Status != "ready" {
		t.Fatalf("build on a: %s (%+v)\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	for _, d := range []*daemon{a, b} {
		if got := listedTemplates(t, d)["shared-tpl"]; got != tid {
			t.Fatalf("GET /templates on %s lists shared-tpl as %q, want %s", d.DataDir, got, tid)
		}
		if r := d.do(t, "GET", "/templates/"+tid, d.Key, nil, nil); r.Status != http.StatusOK || !strings.Contains(string(r.Body), bid) {
			t.Fatalf("GET /templates/%s on %s = %d %s", tid, d.DataDir, r.Status, r.Body)
		}
	}

	// B pulls it at its first create; the files are A's.
	start := time.Now()
	sb := b.create(t, api.NewSandbox{TemplateID: "shared-tpl"})
	pulled := time.Since(start)
	start = time.Now()
	sb2 := b.create(t, api.NewSandbox{TemplateID: "shared-tpl"})
	local := time.Since(start)
	start = time.Now()
	sbA := a.create(t, api.NewSandbox{TemplateID: "shared-tpl"})
	onBuilder := time.Since(start)
	// The files as the template has them: names, types, modes, owners,
	// sizes, times to the nanosecond, link targets (not link counts: on
	// A the build's layer trees share inodes beyond the template's tree;
	// nor /usr/bin, where each sandbox's start links sudo).
	const look = "cat /opt/marker; sha256sum -c --quiet /opt/blob.sum; find /opt /usr/lib /usr/share /usr/sbin /etc/apt /etc/passwd /etc/sudoers -xdev -printf '%p %M %U:%G %s %T@ %l\\n' | sort | sha256sum; find /usr/lib | wc -l"
	onA := sh(t, sbA.Envd(), look)
	if !strings.HasPrefix(onA, marker+"\n") {
		t.Fatalf("in a sandbox of shared-tpl on a: %q", onA)
	}
	if onB := sh(t, sb.Envd(), look); onB != onA {
		t.Fatalf("in a sandbox of shared-tpl on b:\n%s\non a:\n%s", onB, onA)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("first start of a template (base + 8 MiB, its whole tree one layer): on a node that must pull it %v, on one that has it %v (the same node again; %v on the node that built it): pull+start / start = %.0f× (load %s)",
		pulled.Round(time.Millisecond), local.Round(time.Millisecond), onBuilder.Round(time.Millisecond),
		float64(pulled)/float64(local), strings.TrimSpace(string(load)))
	for _, s := range []*client.Sandbox{sb, sb2, sbA} {
		if err := s.Kill(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}

	// A second template, through `fence template build -f`; the registry
	// then serves other bytes: B refuses them and keeps nothing.
	dir := t.TempDir()
	df := filepath.Join(dir, "Dockerfile")
	if err := os.WriteFile(df, []byte("FROM e2bdev/base\nRUN echo second-"+marker+" > /opt/second\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := a.fenceCLI(t, nil, "template", "build", "shared-two", "-f", df); code != 0 {
		t.Fatalf("fence template build shared-two -f = %d\n%s\n%s", code, out, errs)
	}
	before := treeNames(t, b)
	cr.corrupt.Store(true)
	r := b.do(t, "POST", "/sandboxes", b.Key, strings.NewReader(`{"templateID":"shared-two","timeout":60}`), nil)
	cr.corrupt.Store(false)
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(string(r.Body), "digest mismatch") {
		t.Fatalf("a create on b of a template the registry serves other bytes of = %d %s, want 503 naming the digest mismatch", r.Status, r.Body)
	}
	if after := treeNames(t, b); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("a refused pull left trees on b: %v, before %v", after, before)
	}

	// Concurrent creates on B wait on one pull.
	cr.manifests.Store(0)
	var wg sync.WaitGroup
	outs := make([]string, 3)
	for i := range outs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			s, err := b.Client.Create(ctx, api.NewSandbox{TemplateID: "shared-two"})
			if err != nil {
				outs[i] = "create: " + err.Error()
				return
			}
			defer s.Kill(context.WithoutCancel(ctx))
			var o strings.Builder
			if _, err := s.Envd().Run(ctx, client.ProcessSpec{Cmd: "cat", Args: []string{"/opt/second"}, Stdout: &o}); err != nil {
				outs[i] = "run: " + err.Error()
				return
			}
			outs[i] = o.String()
		})
	}
	wg.Wait()
	for i, o := range outs {
		if o != "second-"+marker+"\n" {
			t.Errorf("concurrent create %d of shared-two on b: %q", i, o)
		}
	}
	if n := cr.manifests.Load(); n != 1 {
		t.Errorf("3 concurrent creates on b fetched the manifest %d times, want 1 (one pull)", n)
	}

	// Built again on B (which only pulled it): a new build of the same
	// template, which A then pulls at its next create.
	if err := os.WriteFile(df, []byte("FROM e2bdev/base\nRUN echo third-"+marker+" > /opt/second\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := b.fenceCLI(t, nil, "template", "build", "shared-two", "-f", df); code != 0 {
		t.Fatalf("fence template build shared-two -f on b = %d\n%s\n%s", code, out, errs)
	}
	if got, want := listedTemplates(t, a)["shared-two"], listedTemplates(t, b)["shared-two"]; got == "" || got != want {
		t.Errorf("shared-two rebuilt on b: listed as %q on a, %q on b; want one template", got, want)
	}
	sbA = a.create(t, api.NewSandbox{TemplateID: "shared-two"})
	if out := sh(t, sbA.Envd(), "cat /opt/second"); out != "third-"+marker+"\n" {
		t.Errorf("shared-two on a after its rebuild on b: %q", out)
	}
	if err := sbA.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// A node whose registry cannot be reached fails its build clearly.
	c := startDaemon(t, filepath.Join(testutil.StateDir(t), "c"), "--database", dsn, "--secrets-key", key, "--registry", "127.0.0.1:1/fence")
	ctid, cbid := buildTemplate(t, c, "unpushed", client.TemplateBuildSpec{FromTemplate: "base", Steps: steps("true")})
	st, logs := waitBuild(t, c, ctid, cbid)
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "content registry") {
		t.Fatalf("a build on a node whose registry is unreachable: %s (%+v)\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	if _, ok := listedTemplates(t, a)["unpushed"]; ok {
		t.Errorf("a template whose push failed is listed on a")
	}

	// Deleted through B (which pulled it): gone from every node's list,
	// and A, which built it, drops its copy at its next use.
	if r := b.do(t, "DELETE", "/templates/"+tid, b.Key, nil, nil); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE /templates/%s on b = %d %s", tid, r.Status, r.Body)
	}
	for _, d := range []*daemon{a, b} {
		if _, ok := listedTemplates(t, d)["shared-tpl"]; ok {
			t.Errorf("a deleted template is listed on %s", d.DataDir)
		}
	}
	if r := a.do(t, "POST", "/sandboxes", a.Key, strings.NewReader(`{"templateID":"shared-tpl","timeout":60}`), nil); r.Status != http.StatusNotFound {
		t.Errorf("a create on a of a template deleted through b = %d %s, want 404", r.Status, r.Body)
	}
}

// TestScaleoutTemplatesThroughRegistry runs two nodes on a real
// kube-apiserver, one PostgreSQL database and one content registry, behind
// `fence router --shared-database --shared-registry`: a template built
// through the router (every route of its build, a files upload included,
// on the node the router ranks first for the key) starts through the
// router on both nodes (the other one pulls it) with its files, and the
// router lists it.
func TestScaleoutTemplatesThroughRegistry(t *testing.T) {
	testutil.RequireRoot(t)
	requireTemplate(t, "base")
	k, _, key := startCluster(t)
	templatesDir(t)
	dsn := pgtest.New(t).Database(t)
	cr := startRegistry(t)
	flags := []string{"--database", dsn, "--secrets-key", clusterKey(t), "--registry", cr.URL, "--max-sandboxes", "4"}
	startNode(t, k, "node-a", key, flags...)
	startNode(t, k, "node-b", key, flags...)
	r := startRouter(t, k, key, 0, "--shared-database", "--shared-registry")
	eventually(t, 30*time.Second, "router sees 2 placeable nodes", func() bool {
		st, live, pl := r.health()
		return st == 200 && live == 2 && pl == 2
	})
	via := &daemon{t: t, URL: r.URL, Key: key, Client: client.New(r.URL, key)}

	// The build goes through the router, which sends all of its routes
	// (register, the files' link and upload, trigger, status) to one node.
	marker := randHex(16)
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	_ = tw.WriteHeader(&tar.Header{Name: "marker.txt", Mode: 0o644, Size: int64(len(marker))})
	_, _ = tw.Write([]byte(marker))
	_ = tw.Close()
	reg, err := via.Client.RegisterTemplate(ctxT(t), "routed-tpl", nil)
	if err != nil {
		t.Fatalf("RegisterTemplate through the router: %v", err)
	}
	tid, bid := reg.TemplateID, reg.BuildID
	hash := fmt.Sprintf("%x", sha256.Sum256(archive.Bytes()))
	if up, err := via.Client.UploadTemplateFiles(ctxT(t), tid, hash, bytes.NewReader(archive.Bytes()), int64(archive.Len()), false); err != nil || !up {
		t.Fatalf("files upload through the router: %v (uploaded %v)", err, up)
	}
	spec := client.TemplateBuildSpec{FromTemplate: "base", Steps: steps("echo " + marker + " > /opt/marker")}
	if err := via.Client.TriggerTemplateBuild(ctxT(t), tid, bid, spec); err != nil {
		t.Fatalf("TriggerTemplateBuild through the router: %v", err)
	}
	if st, logs := waitBuild(t, via, tid, bid); st.Status != "ready" {
		t.Fatalf("build through the router: %s (%+v)\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	if got := listedTemplates(t, via)["routed-tpl"]; got != tid {
		t.Fatalf("GET /templates through the router lists routed-tpl as %q, want %s", got, tid)
	}
	// The router places by the free capacity the nodes' Leases report
	// (renewed every 3 s): a create once the first node's Lease counts its
	// sandbox goes to the other node.
	tags := map[string]bool{}
	for i := 0; len(tags) < 2 && i < 4; i++ {
		if i > 0 {
			time.Sleep(4 * time.Second)
		}
		sb := via.create(t, api.NewSandbox{TemplateID: "routed-tpl"})
		tags[sb.ID()[:cluster.TagLen]] = true
		if out := rsh(t, sb.Envd(), "cat /opt/marker"); out != marker+"\n" {
			t.Fatalf("a sandbox of routed-tpl placed through the router (%s): %q", sb.ID(), out)
		}
	}
	if !tags[cluster.Tag("node-b")] || !tags[cluster.Tag("node-a")] {
		t.Errorf("creates through the router went to node tags %v, want both nodes'", tags)
	}
}
