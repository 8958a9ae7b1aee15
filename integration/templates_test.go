package integration

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	. "github.com/fencesandbox/fence/internal/oci/ocitest"
)

// buildTemplate registers a build of name, triggers it with spec and
// returns the template and build IDs.
func buildTemplate(t *testing.T, d *daemon, name string, spec client.TemplateBuildSpec) (string, string) {
	t.Helper()
	reg, err := d.Client.RegisterTemplate(ctxT(t), name, nil)
	if err != nil {
		t.Fatalf("RegisterTemplate(%s): %v", name, err)
	}
	if err := d.Client.TriggerTemplateBuild(ctxT(t), reg.TemplateID, reg.BuildID, spec); err != nil {
		t.Fatalf("TriggerTemplateBuild(%s): %v", name, err)
	}
	return reg.TemplateID, reg.BuildID
}

// waitBuild follows a build to its end and returns its final state and
// every log line.
func waitBuild(t *testing.T, d *daemon, tid, bid string) (*client.TemplateBuildStatus, []string) {
	t.Helper()
	var lines []string
	offset := 0
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := d.Client.TemplateBuildStatus(ctxT(t), tid, bid, offset)
		if err != nil {
			t.Fatalf("build status: %v", err)
		}
		for _, e := range st.LogEntries {
			lines = append(lines, e.Step+" "+e.Message)
		}
		offset += len(st.LogEntries)
		if (st.Status == "ready" || st.Status == "error") && len(st.LogEntries) == 0 {
			return st, lines
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("build %s did not end in 5 minutes; log:\n%s", bid, strings.Join(lines, "\n"))
	return nil, nil
}

func steps(cmds ...string) []client.TemplateStep {
	var out []client.TemplateStep
	for _, c := range cmds {
		out = append(out, client.TemplateStep{Type: "RUN", Args: []string{c, "root"}})
	}
	return out
}

// A build's steps are as contained as any sandbox: a step cannot write the
// host through the layer it leaves (symlinks to /, paths through them),
// cannot reach the host or addresses outside the build allowlist, and the
// template it makes keeps its links as links.
func TestTemplateBuildContained(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	marker := "fence-tbuild-pwn-" + randHex(6)
	hostTmp := filepath.Join(os.TempDir(), marker)

	var hits atomic.Int64
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	var probes []string
	for _, ip := range hostIPv4s(t) {
		probes = append(probes, fmt.Sprintf("curl -s --max-time 3 http://%s:%d/ >/dev/null 2>&1 && echo reached %s >> /opt/egress || true", ip, port, ip))
	}
	probes = append(probes, "curl -s --max-time 5 http://example.com/ >/dev/null 2>&1 && echo reached example.com >> /opt/egress || true",
		"touch /opt/egress")

	spec := client.TemplateBuildSpec{FromTemplate: "base", Steps: steps(
		"ln -s / /hostroot && ln -s /tmp /etc/tmplink && mkdir -p /opt/deep && ln -s /etc /opt/deep/etc",
		"echo pwned > /hostroot/tmp/"+marker+" && echo pwned > /etc/tmplink/"+marker+"-2 ; echo pwned > /proc/1/root/tmp/"+marker+"-3 2>/dev/null; true",
		"rm -rf /hostroot/tmp/"+marker+"-3; ln -sf /etc/shadow /tmp/shadowlink",
		strings.Join(probes, "; "),
	)}
	tid, bid := buildTemplate(t, d, "contained", spec)
	st, logs := waitBuild(t, d, tid, bid)
	if st.Status != "ready" {
		t.Fatalf("build status %s (%+v); log:\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	for _, p := range []string{hostTmp, hostTmp + "-2", hostTmp + "-3", "/" + marker} {
		if _, err := os.Lstat(p); err == nil {
			os.Remove(p)
			t.Errorf("a build step wrote the host's %s", p)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("a build step reached a server on the host (%d requests)", n)
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "contained"})
	e := sb.Envd()
	out := sh(t, e, "readlink /hostroot /etc/tmplink /opt/deep/etc /tmp/shadowlink; cat /tmp/"+marker+"; cat /opt/egress; echo end")
	want := "/\n/tmp\n/etc\n/etc/shadow\npwned\nend\n"
	if out != want {
		t.Errorf("in a sandbox of the built template:\n%s\nwant (links kept as links, the write inside the sandbox, no egress):\n%s", out, want)
	}
}

// A daemon killed (SIGKILL) in the middle of a build leaves no template and
// no build sandbox; after the restart the build reads failed, and a
// rebuild works (the steps finished before the kill are cached).
func TestTemplateBuildKilledMidway(t *testing.T) {
	requireTemplate(t, "base")
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	spec := client.TemplateBuildSpec{FromTemplate: "base", Steps: steps("echo one > /opt/one", "touch /opt/started; sleep 600")}
	tid, bid := buildTemplate(t, d, "midway", spec)
	eventually(t, 2*time.Minute, "the long step starts", func() bool {
		st, err := d.Client.TemplateBuildStatus(ctxT(t), tid, bid, 0)
		if err != nil {
			return false
		}
		for _, e := range st.LogEntries {
			if e.Step == "2" {
				return true
			}
		}
		return false
	})
	time.Sleep(500 * time.Millisecond)
	d.Crash()
	d.Restart()
	st, err := d.Client.TemplateBuildStatus(ctxT(t), tid, bid, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "interrupted") {
		t.Errorf("after the restart the build is %s (%+v), want error (interrupted)", st.Status, st.Reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "midway"}); err == nil {
		t.Errorf("a sandbox of the interrupted build was created")
	}
	trees := filepath.Join(dataDir, "builds", "trees")
	for _, n := range dirEntries(trees) {
		if strings.HasPrefix(n, ".tmp-") {
			t.Errorf("a half-made layer remains: %s", n)
		}
	}
	assertNoSandboxLeftovers(t, dataDir, d.sandboxIDs(), nil)

	spec.Steps = steps("echo one > /opt/one", "echo two > /opt/two")
	tid2, bid2 := buildTemplate(t, d, "midway", spec)
	if tid2 != tid {
		t.Errorf("the rebuild made template %s, want the same %s", tid2, tid)
	}
	st, logs := waitBuild(t, d, tid2, bid2)
	if st.Status != "ready" {
		t.Fatalf("rebuild %s: %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	if !strings.Contains(strings.Join(logs, "\n"), "1 CACHED [builder 1/2]") {
		t.Errorf("the step finished before the kill was not cached:\n%s", strings.Join(logs, "\n"))
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "midway"})
	if out := sh(t, sb.Envd(), "cat /opt/one /opt/two; ls /opt/started 2>&1 >/dev/null | wc -l"); out != "one\ntwo\n1\n" {
		t.Errorf("sandbox of the rebuild: %q", out)
	}
}

// Malformed requests get clear errors and change nothing.
func TestTemplateBuildBadInput(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	reg, err := d.Client.RegisterTemplate(ctxT(t), "badinput", nil)
	if err != nil {
		t.Fatal(err)
	}
	hash := strings.Repeat("0f", 32)
	r := d.do(t, "GET", "/templates/"+reg.TemplateID+"/files/"+hash, d.Key, nil, nil)
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if r.Status != 201 || json.Unmarshal(r.Body, &link) != nil || link.URL == "" || link.Present {
		t.Fatalf("files link: %d %s", r.Status, r.Body)
	}
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../../etc/cron.d/x", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.Close()
	for name, body := range map[string][]byte{
		"garbage":     []byte(strings.Repeat("not a tar ", 100)),
		"bad gzip":    {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3},
		"dot-dot tar": evil.Bytes(),
	} {
		// A link takes one PUT, refused or not: each body gets its own.
		r := d.do(t, "GET", "/templates/"+reg.TemplateID+"/files/"+hash, d.Key, nil, nil)
		if r.Status != 201 || json.Unmarshal(r.Body, &link) != nil || link.URL == "" {
			t.Fatalf("files link: %d %s", r.Status, r.Body)
		}
		path := strings.TrimPrefix(link.URL, d.URL)
		r = d.do(t, "PUT", path, "", bytes.NewReader(body), nil)
		if r.Status != 400 || !strings.Contains(string(r.Body), "upload") {
			t.Errorf("%s upload: %d %s, want 400 naming the upload", name, r.Status, r.Body)
		}
		if r := d.do(t, "PUT", path, "", bytes.NewReader(body), nil); r.Status != 409 {
			t.Errorf("%s upload again through the link: %d %s, want 409", name, r.Status, r.Body)
		}
	}
	if r := d.do(t, "PUT", "/_fence/template-files/wrongtoken", "", strings.NewReader("x"), nil); r.Status != 404 {
		t.Errorf("upload with a wrong token: %d %s", r.Status, r.Body)
	}
	if r := d.do(t, "GET", "/templates/"+reg.TemplateID+"/files/"+hash, d.Key, nil, nil); !strings.Contains(string(r.Body), `"present":false`) {
		t.Errorf("a refused upload was kept: %s", r.Body)
	}
	bp := "/v2/templates/" + reg.TemplateID + "/builds/" + reg.BuildID
	for body, want := range map[string]string{
		`{`: "",
		`{"fromTemplate":"base","fromImage":"x"}`: "both",
		`{}`: "either",
		`{"fromTemplate":"base","steps":[{"type":"HEALTHCHECK","args":["x"]}]}`:     "HEALTHCHECK",
		`{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","/b","",""]}]}`: "filesHash",
		`{"fromTemplate":"base","steps":[{"type":"USER","args":["bad user;"]}]}`:    "user",
		`{"fromTemplate":"base","fromImageRegistry":{"type":"azure"}}`:              "azure",
		`{"fromTemplate":"base","steps":[{"type":"ENV","args":["1BAD","x"]}]}`:      "1BAD",
	} {
		r := d.do(t, "POST", bp, d.Key, strings.NewReader(body), nil)
		if r.Status != 400 || !strings.Contains(string(r.Body), want) {
			t.Errorf("trigger %s: %d %s, want 400 with %q", body, r.Status, r.Body, want)
		}
	}
	if r := d.do(t, "GET", "/templates/"+reg.TemplateID+"/builds/"+reg.BuildID+"/status", d.Key, nil, nil); !strings.Contains(string(r.Body), `"status":"waiting"`) {
		t.Errorf("refused triggers changed the build: %s", r.Body)
	}
	// A COPY of files never uploaded fails the build at that step.
	spec := client.TemplateBuildSpec{FromTemplate: "minimal", Steps: []client.TemplateStep{{Type: "COPY", Args: []string{"a", "/b", "", ""}, FilesHash: hash}}}
	if err := d.Client.TriggerTemplateBuild(ctxT(t), reg.TemplateID, reg.BuildID, spec); err != nil {
		t.Fatal(err)
	}
	st, logs := waitBuild(t, d, reg.TemplateID, reg.BuildID)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "1" || !strings.Contains(st.Reason.Message, "never uploaded") {
		t.Errorf("COPY of missing files: %s %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	if r := d.do(t, "POST", bp, d.Key, strings.NewReader(`{"fromTemplate":"base"}`), nil); r.Status != 400 || !strings.Contains(string(r.Body), "waiting") {
		t.Errorf("second trigger: %d %s, want 400 (not waiting)", r.Status, r.Body)
	}
	if r := d.do(t, "GET", "/templates/"+reg.TemplateID+"/builds/"+"00000000-0000-4000-8000-000000000000/status", d.Key, nil, nil); r.Status != 400 {
		t.Errorf("status of an unknown build: %d %s, want 400", r.Status, r.Body)
	}
	if r := d.do(t, "POST", "/v3/templates", d.Key, strings.NewReader(`{"name":"Bad Name!"}`), nil); r.Status != 400 {
		t.Errorf("register a bad name: %d %s", r.Status, r.Body)
	}
}

// An upload link takes one PUT: a second one is refused and drops what
// the first kept. Files kept under a hash stay its files: an upload of
// other files under it is refused, and a later COPY of the hash copies
// the files first kept.
func TestTemplateUploadLinks(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	reg, err := d.Client.RegisterTemplate(ctxT(t), "uploadlinks", nil)
	if err != nil {
		t.Fatal(err)
	}
	link := func(hash string) (present bool, path string) {
		t.Helper()
		r := d.do(t, "GET", "/templates/"+reg.TemplateID+"/files/"+hash, d.Key, nil, nil)
		var l struct {
			Present bool   `json:"present"`
			URL     string `json:"url"`
		}
		if r.Status != 201 || json.Unmarshal(r.Body, &l) != nil {
			t.Fatalf("files link: %d %s", r.Status, r.Body)
		}
		return l.Present, strings.TrimPrefix(l.URL, d.URL)
	}
	archive := func(content string) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		tw := tar.NewWriter(zw)
		tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755})
		tw.WriteHeader(&tar.Header{Name: "app/a", Typeflag: tar.TypeReg, Size: int64(len(content)), Mode: 0o644})
		tw.Write([]byte(content))
		tw.Close()
		zw.Close()
		return buf.Bytes()
	}
	put := func(path string, body []byte) int {
		t.Helper()
		return d.do(t, "PUT", path, "", bytes.NewReader(body), nil).Status
	}

	// A link used twice: refused, and nothing kept under the hash.
	twice := strings.Repeat("1d", 32)
	_, p := link(twice)
	if st := put(p, archive("first\n")); st/100 != 2 {
		t.Fatalf("first PUT: %d", st)
	}
	if st := put(p, archive("second\n")); st != 409 {
		t.Errorf("second PUT to one link: %d, want 409", st)
	}
	if present, _ := link(twice); present {
		t.Error("the files of a link used twice are kept")
	}

	// Other files under a kept hash: refused; the same files: accepted.
	hash := strings.Repeat("2e", 32)
	_, p = link(hash)
	if st := put(p, archive("good\n")); st/100 != 2 {
		t.Fatalf("upload: %d", st)
	}
	present, p := link(hash)
	if !present {
		t.Fatal("the upload is not present")
	}
	if put(p, archive("good\n")) != 200 {
		t.Error("the same files again (forceUpload) were refused")
	}
	if _, p = link(hash); put(p, archive("evil\n")) != 409 {
		t.Errorf("other files under a kept hash were not refused")
	}
	spec := client.TemplateBuildSpec{FromTemplate: "minimal", Steps: []client.TemplateStep{
		{Type: "COPY", Args: []string{"app", "/app", "", ""}, FilesHash: hash},
		{Type: "RUN", Args: []string{"echo copied: $(cat /app/a)", "root"}},
	}}
	if err := d.Client.TriggerTemplateBuild(ctxT(t), reg.TemplateID, reg.BuildID, spec); err != nil {
		t.Fatal(err)
	}
	st, logs := waitBuild(t, d, reg.TemplateID, reg.BuildID)
	all := strings.Join(logs, "\n")
	if st.Status != "ready" {
		t.Fatalf("build %s %+v:\n%s", st.Status, st.Reason, all)
	}
	if !strings.Contains(all, "copied: good") || strings.Contains(all, "evil") {
		t.Errorf("the COPY did not copy the files first kept under its hash:\n%s", all)
	}
}

// A build from a registry image (E2B's fromImage with fromImageRegistry
// credentials) pulls with the credentials, runs its steps with the
// image's env and workdir, and its sandboxes see the image's layers;
// wrong credentials and AWS keys fail the build clearly.
func TestTemplateBuildFromImage(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	reg := NewRegistry(t)
	ref := reg.Push(t, "fence/bb:1", busyboxImage(t))
	reg.Authorize = func(w http.ResponseWriter, r *http.Request) bool {
		if u, p, ok := r.BasicAuth(); ok && u == "puller" && p == "s3cret" {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="fence-test"`)
		w.WriteHeader(http.StatusUnauthorized)
		return false
	}
	trigger := func(name, registry string, force bool) (string, string) {
		t.Helper()
		reg, err := d.Client.RegisterTemplate(ctxT(t), name, nil)
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"fromImage":%q,"fromImageRegistry":%s,"force":%v,"steps":[`+
			`{"type":"RUN","args":["id -u > /work/who; pwd > /work/pwd; echo $PATH > /work/path"],"force":false}]}`, ref, registry, force)
		r := d.do(t, "POST", "/v2/templates/"+reg.TemplateID+"/builds/"+reg.BuildID, d.Key, strings.NewReader(body), nil)
		if r.Status != 202 {
			t.Fatalf("trigger: %d %s", r.Status, r.Body)
		}
		return reg.TemplateID, reg.BuildID
	}

	tid, bid := trigger("wrongcreds", `{"type":"registry","username":"puller","password":"nope"}`, false)
	st, logs := waitBuild(t, d, tid, bid)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "base" || !strings.Contains(st.Reason.Message, "pulling image") {
		t.Errorf("wrong credentials: %s %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	tid, bid = trigger("awskeys", `{"type":"aws","awsAccessKeyId":"AKIA","awsSecretAccessKey":"x","awsRegion":"us-east-1"}`, false)
	if st, _ := waitBuild(t, d, tid, bid); st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "aws") {
		t.Errorf("aws keys: %s %+v, want a clear error", st.Status, st.Reason)
	}

	tid, bid = trigger("fromimage", `{"type":"registry","username":"puller","password":"s3cret"}`, false)
	st, logs = waitBuild(t, d, tid, bid)
	if st.Status != "ready" {
		t.Fatalf("build from %s: %s %+v\n%s", ref, st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	r := d.do(t, "GET", "/templates/"+tid+"/builds/"+bid+"/status", d.Key, nil, nil)
	if strings.Contains(string(r.Body), "s3cret") {
		t.Errorf("the registry password shows in the build status")
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "fromimage"})
	out := sh(t, sb.Envd(), "cat /work/who /work/pwd /work/path /etc/opq/c; id -u; pwd")
	if want := "1000\n/work\n/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nc\n1000\n/work\n"; out != want {
		t.Errorf("sandbox of the image template:\n%q\nwant\n%q", out, want)
	}
}

// COPY archives are kept for reuse while clients use them, and removed
// once unused for a day: an archive the SDK asks about again stays, one
// nobody asked about for a day goes at the next start.
func TestTemplateFileArchivesCollected(t *testing.T) {
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir)
	reg, err := d.Client.RegisterTemplate(ctxT(t), "archives", nil)
	if err != nil {
		t.Fatal(err)
	}
	link := func(hash string) (present bool, path string) {
		t.Helper()
		r := d.do(t, "GET", "/templates/"+reg.TemplateID+"/files/"+hash, d.Key, nil, nil)
		var l struct {
			Present bool   `json:"present"`
			URL     string `json:"url"`
		}
		if r.Status != 201 || json.Unmarshal(r.Body, &l) != nil {
			t.Fatalf("files link: %d %s", r.Status, r.Body)
		}
		return l.Present, strings.TrimPrefix(l.URL, d.URL)
	}
	hashes := []string{strings.Repeat("a1", 32), strings.Repeat("b2", 32), strings.Repeat("c3", 32)}
	for _, h := range hashes {
		_, path := link(h)
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
		tw.Write([]byte("x"))
		tw.Close()
		if r := d.do(t, "PUT", path, "", &buf, nil); r.Status/100 != 2 {
			t.Fatalf("upload %s: %d %s", h[:4], r.Status, r.Body)
		}
	}
	// a1 and b2 were last used two days ago; b2 is asked about again.
	old := time.Now().Add(-48 * time.Hour)
	for _, h := range hashes[:2] {
		if err := os.Chtimes(filepath.Join(dataDir, "builds", "files", h+".tar"), old, old); err != nil {
			t.Fatal(err)
		}
	}
	if present, _ := link(hashes[1]); !present {
		t.Fatalf("b2 is not present after its upload")
	}
	d.Stop()
	d.Restart()
	for i, want := range []bool{false, true, true} {
		if present, _ := link(hashes[i]); present != want {
			t.Errorf("archive %s present = %v after a restart, want %v", hashes[i][:4], present, want)
		}
	}
}
