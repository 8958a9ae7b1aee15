package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/testutil"
)

// newVolume makes a volume of sizeMB through the API.
func (d *daemon) newVolume(t *testing.T, name string, sizeMB int) api.VolumeAndToken {
	t.Helper()
	var v api.VolumeAndToken
	r := d.do(t, "POST", "/volumes", d.Key, strings.NewReader(`{"name":"`+name+`","sizeMB":`+itoa(sizeMB)+`}`), nil)
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &v) != nil {
		t.Fatalf("POST /volumes %s = %d %s", name, r.Status, r.Body)
	}
	return v
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// content sends a volume content API request with v's token.
func (d *daemon) content(t *testing.T, v api.VolumeAndToken, method, rest, body string) rawResponse {
	t.Helper()
	var rd *strings.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	hdr := map[string]string{"Authorization": "Bearer " + v.Token}
	if rd == nil {
		return d.do(t, method, "/volumecontent/"+v.VolumeID+"/"+rest, "", nil, hdr)
	}
	return d.do(t, method, "/volumecontent/"+v.VolumeID+"/"+rest, "", rd, hdr)
}

// Two sandboxes mount one volume and see each other's writes; its owner
// inside is the templates' user; writing past its size fails with ENOSPC
// inside, and the image on the host holds no more than the size; a
// symlink to /etc/shadow made inside is never followed by the content
// API; the volume cannot be deleted while mounted, and can be once the
// sandboxes are gone, leaving nothing on the host.
func TestVolumeMountedInTwoSandboxes(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	v := d.newVolume(t, "shared", 8)
	if r := d.content(t, v, "PUT", "file?path=/from-api.txt", "from the api"); r.Status != http.StatusCreated {
		t.Fatalf("write = %d %s", r.Status, r.Body)
	}
	mounts := []api.VolumeMount{{Name: "shared", Path: "/data"}}
	a := d.create(t, api.NewSandbox{VolumeMounts: mounts})
	b := d.create(t, api.NewSandbox{VolumeMounts: mounts})
	if got := rsh(t, a.Envd(), `cat /data/from-api.txt; echo; stat -c '%u:%g' /data`); got != "from the api\n1000:1000\n" {
		t.Errorf("in a: %q", got)
	}
	rsh(t, a.Envd(), `echo from-a > /data/a.txt`)
	if got := rsh(t, b.Envd(), `cat /data/a.txt; echo from-b > /data/b.txt`); got != "from-a\n" {
		t.Errorf("b reads a's write: %q", got)
	}
	if got := rsh(t, a.Envd(), `cat /data/b.txt`); got != "from-b\n" {
		t.Errorf("a reads b's write: %q", got)
	}
	var detail api.SandboxDetail
	if r := d.do(t, "GET", "/sandboxes/"+a.ID(), d.Key, nil, nil); json.Unmarshal(r.Body, &detail) != nil ||
		len(detail.VolumeMounts) != 1 || detail.VolumeMounts[0] != mounts[0] {
		t.Errorf("GET /sandboxes/%s volumeMounts = %s", a.ID(), r.Body)
	}
	var listedAll []api.ListedSandbox
	if r := d.do(t, "GET", "/v2/sandboxes", d.Key, nil, nil); json.Unmarshal(r.Body, &listedAll) != nil || len(listedAll) != 2 ||
		len(listedAll[0].VolumeMounts) != 1 || listedAll[1].VolumeMounts[0] != mounts[0] {
		t.Errorf("GET /v2/sandboxes volumeMounts = %s", r.Body)
	}

	// The size limit.
	out, _, st := run(t, a.Envd(), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", `dd if=/dev/zero of=/data/big bs=1M count=32 2>&1`}, User: "root"})
	if st.ExitCode == 0 || !strings.Contains(out, "No space left on device") {
		t.Errorf("writing 32 MiB into an 8 MiB volume: exit %d, %q", st.ExitCode, out)
	}
	img := filepath.Join(d.DataDir, "volumes", "images", v.VolumeID+".img")
	var ist syscall.Stat_t
	if err := syscall.Stat(img, &ist); err != nil {
		t.Fatal(err)
	}
	if ist.Size != 8<<20 || ist.Blocks*512 > 8<<20 {
		t.Errorf("image %s: size %d, %d bytes allocated; want at most 8 MiB", img, ist.Size, ist.Blocks*512)
	}
	if r := d.content(t, v, "PUT", "file?path=/more", strings.Repeat("x", 1<<20)); r.Status != http.StatusInsufficientStorage {
		t.Errorf("writing into the full volume through the API = %d %s, want 507", r.Status, r.Body)
	}
	if r := d.content(t, v, "GET", "path?path=/more", ""); r.Status != http.StatusNotFound {
		t.Errorf("the failed write left /more: %d %s", r.Status, r.Body)
	}
	rsh(t, a.Envd(), `rm /data/big`)

	// A symlink made inside.
	shadow, err := os.ReadFile("/etc/shadow")
	if err != nil {
		t.Fatal(err)
	}
	firstLine, _, _ := strings.Cut(string(shadow), "\n")
	rsh(t, a.Envd(), `ln -s /etc/shadow /data/shadow; ln -s / /data/root`)
	for _, rest := range []string{"file?path=/shadow", "file?path=/root/etc/shadow", "dir?path=/root", "dir?path=/root/etc"} {
		if r := d.content(t, v, "GET", rest, ""); r.Status != http.StatusBadRequest || strings.Contains(string(r.Body), firstLine) {
			t.Errorf("GET %s = %d %s, want 400", rest, r.Status, r.Body)
		}
	}
	for _, rest := range []string{"file?path=/shadow&force=true", "file?path=/root/etc/shadow&force=true"} {
		if r := d.content(t, v, "PUT", rest, "overwritten"); r.Status != http.StatusBadRequest {
			t.Errorf("PUT %s = %d %s, want 400", rest, r.Status, r.Body)
		}
	}
	if r := d.content(t, v, "PATCH", "path?path=/shadow", `{"mode":511}`); r.Status != http.StatusBadRequest {
		t.Errorf("PATCH /shadow mode = %d %s, want 400", r.Status, r.Body)
	}
	var stat api.VolumeEntryStat
	if r := d.content(t, v, "GET", "path?path=/shadow", ""); r.Status != http.StatusOK || json.Unmarshal(r.Body, &stat) != nil ||
		stat.Type != "symlink" || stat.Target != "/etc/shadow" {
		t.Errorf("stat /shadow = %d %s", r.Status, r.Body)
	}
	if r := d.content(t, v, "DELETE", "path?path=/root", ""); r.Status != http.StatusNoContent {
		t.Errorf("DELETE /root (a symlink to /) = %d %s", r.Status, r.Body)
	}
	if after, err := os.ReadFile("/etc/shadow"); err != nil || string(after) != string(shadow) {
		t.Errorf("/etc/shadow changed")
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Errorf("/etc/passwd: %v", err)
	}

	// Delete while mounted, then after the kills.
	if r := d.do(t, "DELETE", "/volumes/"+v.VolumeID, d.Key, nil, nil); r.Status != http.StatusConflict {
		t.Errorf("DELETE of a mounted volume = %d %s, want 409", r.Status, r.Body)
	}
	for _, sb := range []*client.Sandbox{a, b} {
		if err := sb.Kill(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	if r := d.do(t, "DELETE", "/volumes/"+v.VolumeID, d.Key, nil, nil); r.Status != http.StatusNoContent {
		t.Errorf("DELETE after the kills = %d %s, want 204", r.Status, r.Body)
	}
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("image after delete: %v", err)
	}
	if r := d.do(t, "GET", "/volumes/"+v.VolumeID, d.Key, nil, nil); r.Status != http.StatusNotFound {
		t.Errorf("GET after delete = %d %s", r.Status, r.Body)
	}
	// The content API's changes are on the audit trail.
	if r := d.do(t, "GET", "/audit?limit=1000", d.Key, nil, nil); !strings.Contains(string(r.Body), "volume:"+v.VolumeID) ||
		!strings.Contains(string(r.Body), `"file":"/from-api.txt"`) {
		t.Errorf("GET /audit has no record of the content API's write: %s", r.Body)
	}
}

// Bad input to the volume routes gets a 4xx and changes nothing.
func TestVolumeBadInput(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	v := d.newVolume(t, "good", 8)
	list := func() string { return string(d.do(t, "GET", "/volumes", d.Key, nil, nil).Body) }
	before := list()
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/volumes", `{"name":"bad name"}`, 400},
		{"POST", "/volumes", `{"name":""}`, 400},
		{"POST", "/volumes", `{"name":"../x"}`, 400},
		{"POST", "/volumes", `{"name":"good"}`, 400},
		{"POST", "/volumes", `{"name":"tiny","sizeMB":1}`, 400},
		{"POST", "/volumes", `{"name":"huge","sizeMB":999999999}`, 400},
		{"POST", "/volumes", `not json`, 400},
		{"GET", "/volumes/not-a-uuid", "", 400},
		{"GET", "/volumes/00000000-0000-4000-8000-000000000000", "", 404},
		{"DELETE", "/volumes/00000000-0000-4000-8000-000000000000", "", 404},
		{"POST", "/sandboxes", `{"templateID":"minimal","volumeMounts":[{"name":"nosuch","path":"/data"}]}`, 400},
		{"POST", "/sandboxes", `{"templateID":"minimal","volumeMounts":[{"name":"good","path":"data"}]}`, 400},
		{"POST", "/sandboxes", `{"templateID":"minimal","volumeMounts":[{"name":"good","path":"/data/../etc"}]}`, 400},
		{"POST", "/sandboxes", `{"templateID":"minimal","volumeMounts":[{"name":"good","path":"/proc/x"}]}`, 400},
		{"POST", "/sandboxes", `{"templateID":"minimal","volumeMounts":[{"name":"good","path":"/a"},{"name":"good","path":"/a"}]}`, 400},
	} {
		var body *strings.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		var r rawResponse
		if body != nil {
			r = d.do(t, c.method, c.path, d.Key, body, nil)
		} else {
			r = d.do(t, c.method, c.path, d.Key, nil, nil)
		}
		if r.Status != c.want {
			t.Errorf("%s %s %s = %d %s, want %d", c.method, c.path, c.body, r.Status, r.Body, c.want)
		}
	}
	for _, c := range []struct {
		method, rest, body string
		want               int
	}{
		{"GET", "path?path=", "", 400},
		{"GET", "path?path=/../x", "", 400},
		{"GET", "path?path=/missing", "", 404},
		{"GET", "file?path=/", "", 400},
		{"DELETE", "path?path=/", "", 400},
		{"POST", "dir?path=/d&mode=99999", "", 400},
		{"POST", "dir?path=/d&uid=-1", "", 400},
		{"POST", "dir?path=/d&force=maybe", "", 400},
		{"POST", "dir?path=/a/b", "", 404},
		{"PUT", "file?path=/no/parent", "x", 404},
		{"GET", "dir?path=/&depth=0", "", 400},
		{"GET", "nosuch?path=/", "", 404},
		{"PUT", "path?path=/", "", 405},
	} {
		if r := d.content(t, v, c.method, c.rest, c.body); r.Status != c.want {
			t.Errorf("%s %s = %d %s, want %d", c.method, c.rest, r.Status, r.Body, c.want)
		}
	}
	if r := d.content(t, v, "GET", "dir?path=/", ""); string(r.Body) != "[]\n" {
		t.Errorf("the volume after bad input: %s", r.Body)
	}
	// Another volume's ID with this one's token, and no token.
	if r := d.do(t, "GET", "/volumecontent/00000000-0000-4000-8000-000000000000/dir?path=/", "", nil,
		map[string]string{"Authorization": "Bearer " + v.Token}); r.Status != http.StatusUnauthorized {
		t.Errorf("another volume with this token = %d %s", r.Status, r.Body)
	}
	if r := d.do(t, "GET", "/volumecontent/"+v.VolumeID+"/dir?path=/", d.Key, nil, nil); r.Status != http.StatusUnauthorized {
		t.Errorf("the API key on the content API = %d %s", r.Status, r.Body)
	}
	// More than the host's disk can hold besides the volumes' own sizes.
	var fs syscall.Statfs_t
	if err := syscall.Statfs(d.DataDir, &fs); err != nil {
		t.Fatal(err)
	}
	if tooMuch := (int64(fs.Bavail)*fs.Bsize)>>20 + 1024; tooMuch <= 1<<20 {
		if r := d.do(t, "POST", "/volumes", d.Key, strings.NewReader(`{"name":"toobig","sizeMB":`+itoa(int(tooMuch))+`}`), nil); r.Status != http.StatusInsufficientStorage {
			t.Errorf("a volume larger than the host's free disk = %d %s, want 507", r.Status, r.Body)
		}
	}
	if after := list(); after != before {
		t.Errorf("volumes changed: %s → %s", before, after)
	}
}

// Volumes, their files and their tokens outlive a daemon crash; what a
// create cut short left (an image without a record) is removed at the
// next start.
func TestVolumeSurvivesCrash(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	v := d.newVolume(t, "lasting", 8)
	if r := d.content(t, v, "PUT", "file?path=/kept.txt", "kept"); r.Status != http.StatusCreated {
		t.Fatalf("write = %d %s", r.Status, r.Body)
	}
	// Not d.create: the crash ends the sandbox, and the restarted daemon
	// listens elsewhere.
	sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal", VolumeMounts: []api.VolumeMount{{Name: "lasting", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	rsh(t, sb.Envd(), `echo synced > /data/sync.txt && sync /data/sync.txt`)
	d.Crash()
	orphan := filepath.Join(d.DataDir, "volumes", "images", "00000000-0000-4000-8000-0000000000aa.img")
	if err := os.WriteFile(orphan, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Restart()
	if r := d.content(t, v, "GET", "file?path=/kept.txt", ""); r.Status != http.StatusOK || string(r.Body) != "kept" {
		t.Errorf("after the crash, the old token reads %d %q", r.Status, r.Body)
	}
	if r := d.content(t, v, "GET", "file?path=/sync.txt", ""); r.Status != http.StatusOK || string(r.Body) != "synced\n" {
		t.Errorf("after the crash, the sandbox's synced write reads %d %q", r.Status, r.Body)
	}
	if r := d.do(t, "GET", "/volumes", d.Key, nil, nil); !strings.Contains(string(r.Body), v.VolumeID) {
		t.Errorf("GET /volumes after the crash = %s", r.Body)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("the orphan image after the restart: %v", err)
	}
}

// A gVisor sandbox mounts a volume through its gofer: it shares writes
// with a native sandbox that mounts the same volume, both ways, owns the
// volume as the templates' user, and hits ENOSPC at its size.
func TestVolumeGvisor(t *testing.T) {
	testutil.RequireRunsc(t)
	d := startDaemon(t, newDataDir(t))
	d.newVolume(t, "both", 8)
	mounts := []api.VolumeMount{{Name: "both", Path: "/data"}}
	g := d.create(t, api.NewSandbox{VolumeMounts: mounts, Metadata: gvisorMeta})
	n := d.create(t, api.NewSandbox{VolumeMounts: mounts})
	rsh(t, g.Envd(), `echo from-gvisor > /data/g.txt`)
	if got := rsh(t, n.Envd(), `cat /data/g.txt; stat -c %u /data/g.txt; echo from-native > /data/n.txt`); got != "from-gvisor\n0\n" {
		t.Errorf("native reads gVisor's write: %q", got)
	}
	if got := rsh(t, g.Envd(), `cat /data/n.txt; stat -c '%u:%g' /data`); got != "from-native\n1000:1000\n" {
		t.Errorf("gVisor reads native's write: %q", got)
	}
	out, _, st := run(t, g.Envd(), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", `dd if=/dev/zero of=/data/big bs=1M count=32 2>&1`}, User: "root"})
	if st.ExitCode == 0 || !strings.Contains(out, "No space left on device") {
		t.Errorf("writing 32 MiB into an 8 MiB volume in gVisor: exit %d, %q", st.ExitCode, out)
	}
}

// A fork mounts its source's volumes, shares their writes, and holds them
// against a delete after its source is gone.
func TestVolumeInheritedByFork(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	v := d.newVolume(t, "inherited", 8)
	src := d.create(t, api.NewSandbox{VolumeMounts: []api.VolumeMount{{Name: "inherited", Path: "/data"}}})
	rsh(t, src.Envd(), `echo before-fork > /data/f.txt`)
	forks, errs, err := d.Client.Fork(ctxT(t), src.ID(), 1, 0)
	if err != nil || len(forks) != 1 || errs[0] != nil {
		t.Fatalf("Fork = %v %v %v", forks, errs, err)
	}
	fork := forks[0]
	t.Cleanup(func() { fork.Kill(ctxT(t)) })
	if got := rsh(t, fork.Envd(), `cat /data/f.txt; echo from-fork > /data/g.txt`); got != "before-fork\n" {
		t.Errorf("the fork reads %q", got)
	}
	if got := rsh(t, src.Envd(), `cat /data/g.txt`); got != "from-fork\n" {
		t.Errorf("the source reads the fork's write: %q", got)
	}
	if err := src.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if r := d.do(t, "DELETE", "/volumes/"+v.VolumeID, d.Key, nil, nil); r.Status != http.StatusConflict {
		t.Errorf("DELETE while the fork mounts it = %d %s, want 409", r.Status, r.Body)
	}
	var detail api.SandboxDetail
	if r := d.do(t, "GET", "/sandboxes/"+fork.ID(), d.Key, nil, nil); json.Unmarshal(r.Body, &detail) != nil || len(detail.VolumeMounts) != 1 {
		t.Errorf("the fork's volumeMounts: %s", r.Body)
	}
}

// A crash of the daemon while a sandbox and the content API write to a
// volume leaves a consistent filesystem: the restarted daemon serves it,
// and after a clean stop e2fsck finds nothing to fix.
func TestVolumeConsistentAfterCrashDuringWrites(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	v := d.newVolume(t, "busy", 64)
	// Not d.create: the crash ends the sandbox.
	sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal", VolumeMounts: []api.VolumeMount{{Name: "busy", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	rsh(t, sb.Envd(), `(i=0; while true; do dd if=/dev/urandom of=/data/f$((i%8)) bs=64k count=16 conv=fsync; i=$((i+1)); done) >/dev/null 2>&1 &`)
	// An upload that is still streaming when the daemon dies.
	pr, pw := io.Pipe()
	sent := make(chan struct{})
	go func() {
		chunk := make([]byte, 64<<10)
		for i := 0; ; i++ {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
			if i == 16 {
				close(sent)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	req, _ := http.NewRequest("PUT", d.URL+"/volumecontent/"+v.VolumeID+"/file?path=/upload", pr)
	req.Header.Set("Authorization", "Bearer "+v.Token)
	go http.DefaultClient.Do(req)
	<-sent
	for i := 0; ; i++ {
		if r := d.content(t, v, "GET", "path?path=/f1", ""); r.Status == http.StatusOK || i == 200 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.Crash()
	pw.CloseWithError(io.ErrClosedPipe)
	d.Restart()
	if r := d.content(t, v, "GET", "dir?path=/", ""); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"f0"`) {
		t.Errorf("after the crash, the list = %d %s", r.Status, r.Body)
	}
	if r := d.content(t, v, "PUT", "file?path=/after", "after"); r.Status != http.StatusCreated {
		t.Errorf("after the crash, a write = %d %s", r.Status, r.Body)
	}
	d.Stop()
	img := filepath.Join(d.DataDir, "volumes", "images", v.VolumeID+".img")
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn of the volume after the crash and a clean stop: %v\n%s", err, out)
	}
}

// A sandbox paused without memory keeps its volume through a daemon
// restart: the volume cannot be deleted while it is paused, and the
// resumed sandbox mounts it again.
func TestVolumeKeptByColdPauseAcrossRestart(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	v := d.newVolume(t, "paused", 8)
	yes, no := true, false
	// Not d.create: its cleanup would use the first daemon's address.
	sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal", AutoPause: &yes, AutoPauseMemory: &no,
		VolumeMounts: []api.VolumeMount{{Name: "paused", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Client.Kill(ctxT(t), sb.ID()) })
	rsh(t, sb.Envd(), `echo before > /data/a`)
	if err := d.Client.PauseWithoutMemory(ctxT(t), sb.ID()); err != nil {
		t.Fatal(err)
	}
	d.Crash()
	d.Restart()
	if r := d.do(t, "DELETE", "/volumes/"+v.VolumeID, d.Key, nil, nil); r.Status != http.StatusConflict {
		t.Errorf("DELETE while a paused sandbox mounts it = %d %s, want 409", r.Status, r.Body)
	}
	resumed, err := d.Client.Connect(ctxT(t), sb.ID(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := rsh(t, resumed.Envd(), `cat /data/a; echo after > /data/b`); got != "before\n" {
		t.Errorf("the resumed sandbox reads %q", got)
	}
	if r := d.content(t, v, "GET", "file?path=/b", ""); string(r.Body) != "after\n" {
		t.Errorf("the resumed sandbox's write through the API: %d %q", r.Status, r.Body)
	}
}

// A rewind takes the sandbox's own files back, never its volume's: the
// rewound sandbox mounts the volume still, with what was written after
// the checkpoint.
func TestVolumeOutlivesRewind(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	d.newVolume(t, "rewound", 8)
	sb := d.create(t, api.NewSandbox{VolumeMounts: []api.VolumeMount{{Name: "rewound", Path: "/data"}}})
	cp, err := d.Client.Checkpoint(ctxT(t), sb.ID(), "before")
	if err != nil {
		t.Fatal(err)
	}
	rsh(t, sb.Envd(), `echo after > /data/v; echo after > /own`)
	if err := d.Client.Rewind(ctxT(t), sb.ID(), cp.CheckpointID); err != nil {
		t.Fatal(err)
	}
	if got := rsh(t, sb.Envd(), `cat /data/v; test -e /own && echo own; true`); got != "after\n" {
		t.Errorf("after the rewind: %q, want the volume's file alone", got)
	}
}
