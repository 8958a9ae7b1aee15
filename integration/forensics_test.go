package integration

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/sandbox/usage"
)

// exported is a forensics archive read back: every entry by name.
type exported struct {
	hdrs  map[string]*tar.Header
	files map[string]string
}

func readExport(t *testing.T, r io.Reader) exported {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatalf("export is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	x := exported{hdrs: map[string]*tar.Header{}, files: map[string]string{}}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return x
		}
		if err != nil {
			t.Fatalf("export is not a whole tar: %v", err)
		}
		x.hdrs[h.Name] = h
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			x.files[h.Name] = string(b)
		}
	}
}

// check asserts what the sandbox of TestForensicsExport changed is in x.
func (x exported) check(t *testing.T, id, state, secret string) {
	t.Helper()
	if got := x.files["changes/opt/evidence.txt"]; got != "evidence "+secret+"\n" {
		t.Errorf("changes/opt/evidence.txt = %q", got)
	}
	for name, want := range map[string]string{"changes/opt/shadow": "/etc/shadow", "changes/opt/etc": "/etc"} {
		h := x.hdrs[name]
		if h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != want || h.Size != 0 {
			t.Errorf("%s = %+v, want a symlink to %s", name, h, want)
		}
	}
	for name := range x.hdrs {
		if strings.HasPrefix(name, "changes/opt/etc/") || strings.HasPrefix(name, "changes/opt/shadow/") {
			t.Errorf("a symlink was followed: %s", name)
		}
		if h := x.hdrs[name]; h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			t.Errorf("a device node is in the export: %s", name)
		}
	}
	host, err := os.ReadFile("/etc/shadow")
	if err == nil && len(host) > 16 {
		for name, body := range x.files {
			if strings.Contains(body, string(host)) {
				t.Errorf("the host's /etc/shadow is in %s", name)
			}
		}
	}
	wo := x.files["changes/.whiteouts"]
	if !strings.Contains(wo, "\n/etc/hostname\n") {
		t.Errorf("changes/.whiteouts does not list the deleted /etc/hostname: %q", wo)
	}
	var md map[string]any
	if err := json.Unmarshal([]byte(x.files["metadata.json"]), &md); err != nil || md["state"] != state || md["id"] != id {
		t.Errorf("metadata.json = %s (%v), want state %s", x.files["metadata.json"], err, state)
	}
	if strings.Contains(x.files["metadata.json"], "envd") || strings.Contains(strings.ToLower(x.files["metadata.json"]), "token") {
		t.Errorf("metadata.json shows an access token: %s", x.files["metadata.json"])
	}
	sawCreate := false
	for _, l := range strings.Split(strings.TrimSpace(x.files["audit.jsonl"]), "\n") {
		var r struct{ Type, Sandbox string }
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Sandbox != id {
			t.Fatalf("audit.jsonl line %q: %v", l, err)
		}
		sawCreate = sawCreate || r.Type == "sandbox.create"
	}
	if !sawCreate {
		t.Errorf("audit.jsonl has no create record")
	}
	var u usage.Usage
	if err := json.Unmarshal([]byte(x.files["usage.json"]), &u); err != nil || u.SandboxID != id || u.State != state {
		t.Errorf("usage.json = %s (%v)", x.files["usage.json"], err)
	}
}

// TestForensicsExport: a sandbox writes a file, deletes a template file
// and plants symlinks to the host's /etc/shadow and /etc; its export,
// running and then killed, holds the file, the symlinks as symlinks
// (never followed), the whiteout listed, and its record, audit records
// and usage. An unknown ID is a 404, from the API and the CLI.
func TestForensicsExport(t *testing.T) {
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	e := sb.Envd().WithUser("root")
	secret := randHex(8)
	sh(t, e, "mkdir -p /opt && echo evidence "+secret+" > /opt/evidence.txt && rm /etc/hostname && ln -s /etc/shadow /opt/shadow && ln -s /etc /opt/etc && mkfifo /opt/fifo")

	out := filepath.Join(t.TempDir(), "live.tar.gz")
	if _, stderr, code := d.fenceCLI(t, nil, "sandbox", "export", sb.ID(), "-o", out); code != 0 {
		t.Fatalf("fence sandbox export: exit %d: %s", code, stderr)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("export file: %v %v, want mode 0600", st, err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	live := readExport(t, f)
	f.Close()
	names := make([]string, 0, len(live.hdrs))
	for n := range live.hdrs {
		names = append(names, n)
	}
	slices.Sort(names)
	t.Logf("export of the running sandbox: %d bytes, %s; whiteouts %q", len(live.files["audit.jsonl"]), strings.Join(names, " "), live.files["changes/.whiteouts"])
	live.check(t, sb.ID(), "running", secret)
	if h := live.hdrs["changes/opt/fifo"]; h == nil || h.Typeflag != tar.TypeFifo {
		t.Errorf("changes/opt/fifo = %+v, want a fifo", h)
	}

	// Paused: its layer is read all the same, and the pause is accounted;
	// it is then killed paused.
	if err := d.Client.Pause(ctxT(t), sb.ID()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	r := d.do(t, "GET", "/sandboxes/"+sb.ID()+"/export", d.Key, nil, nil)
	if r.Status != 200 {
		t.Fatalf("export of the paused sandbox: %d %s", r.Status, r.Body)
	}
	paused := readExport(t, strings.NewReader(string(r.Body)))
	paused.check(t, sb.ID(), "paused", secret)
	var pu usage.Report
	if err := d.Client.Usage(ctxT(t), map[string][]string{"sandbox": {sb.ID()}}, &pu); err != nil {
		t.Fatal(err)
	}
	if len(pu.Sandboxes) != 1 || pu.Sandboxes[0].PausedSeconds < 0.9 || pu.Sandboxes[0].RunningSeconds <= 0 {
		t.Errorf("usage of the paused sandbox: %+v, want a second or more paused", pu.Sandboxes)
	}

	if err := sb.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// The layer is archived in the kill's background release.
	var killed exported
	eventually(t, 30*time.Second, "the killed sandbox's archived layer", func() bool {
		r := d.do(t, "GET", "/sandboxes/"+sb.ID()+"/export", d.Key, nil, nil)
		if r.Status != 200 {
			t.Fatalf("export of the killed sandbox: %d %s", r.Status, r.Body)
		}
		killed = readExport(t, strings.NewReader(string(r.Body)))
		return killed.hdrs["changes/opt/evidence.txt"] != nil && killed.files["usage.json"] != "null\n"
	})
	killed.check(t, sb.ID(), "killed", secret)
	dataDir := d.DataDir
	if st, err := os.Stat(filepath.Join(dataDir, "forensics", sb.ID()+".tar.gz")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("archive: %v %v, want mode 0600", st, err)
	}

	if r := d.do(t, "GET", "/sandboxes/zz"+randHex(6)+"/export", d.Key, nil, nil); r.Status != 404 {
		t.Errorf("export of an unknown sandbox: %d %s, want 404", r.Status, r.Body)
	}
	for _, q := range []string{"since=yesterday", "until=-1h", "sandbox=../x", "sandbox=ABC"} {
		if r := d.do(t, "GET", "/usage?"+q, d.Key, nil, nil); r.Status != 400 {
			t.Errorf("GET /usage?%s: %d %s, want 400", q, r.Status, r.Body)
		}
	}
	if r := d.do(t, "GET", "/usage", "", nil, nil); r.Status != 401 {
		t.Errorf("usage without the API key: %d, want 401", r.Status)
	}
	if r := d.do(t, "GET", "/sandboxes/"+sb.ID()+"/export", "", nil, nil); r.Status != 401 {
		t.Errorf("export without the API key: %d, want 401", r.Status)
	}
	if _, stderr, code := d.fenceCLI(t, nil, "sandbox", "export", "zz"+randHex(6), "-o", filepath.Join(t.TempDir(), "x.tar.gz")); code == 0 || !strings.Contains(stderr, "not found") {
		t.Errorf("fence sandbox export of an unknown sandbox: exit %d, %q", code, stderr)
	}
}

// TestUsageAccounting: a sandbox with one CPU burns CPU for 2 s, holds
// ~100 MiB and downloads a known number of bytes through the fake
// internet; its usage shows CPU-seconds within 30% of what the shell
// measured of its child, GiB-seconds within the bounds the holding time
// sets, and the downloaded bytes; the per-key totals and /metrics agree,
// and the figures outlive the kill (sandbox.usage).
func TestUsageAccounting(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr)
	one := 1.0
	mem := int64(512)
	born := time.Now()
	sb := d.create(t, api.NewSandbox{TemplateID: "base", CPUCount: &one, MemoryMB: &mem,
		Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"allowed.test"}}})
	e := sb.Envd().WithUser("root")

	// CPU: the shell's `times` gives its children's user and system time;
	// the sandbox's usage is read just before and after.
	usageNow := func() usage.Usage {
		var r usage.Report
		if err := d.Client.Usage(ctxT(t), map[string][]string{"sandbox": {sb.ID()}}, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Sandboxes) != 1 || r.Sandboxes[0].State != "running" {
			t.Fatalf("usage of the running sandbox: %+v", r)
		}
		return r.Sandboxes[0]
	}
	before := usageNow()
	out := sh(t, e, "timeout 2 sh -c 'while :; do :; done'; times")
	burnt := usageNow().CPUSeconds - before.CPUSeconds
	lines := strings.Split(strings.TrimSpace(out), "\n")
	childCPU := parseTimes(t, lines[len(lines)-1])

	const n = 5_000_000
	sh(t, e, fmt.Sprintf("curl -sS -o /dev/null http://allowed.test/bench/bytes?n=%d", n))

	// Memory: ~100 MiB held until the kill.
	sh(t, e, "nohup python3 -c 'import time; b = bytearray(100 << 20); open(\"/tmp/held\", \"w\").close(); time.sleep(600)' >/dev/null 2>&1 &")
	eventually(t, 30*time.Second, "the allocation", func() bool {
		_, _, st := run(t, e, client.ProcessSpec{Cmd: "test", Args: []string{"-e", "/tmp/held"}})
		return st.ExitCode == 0
	})
	held := time.Now()
	time.Sleep(12 * time.Second)

	usageNow()
	if err := sb.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	heldFor := time.Since(held).Seconds()
	life := time.Since(born).Seconds()

	var rep usage.Report
	eventually(t, 15*time.Second, "the killed sandbox's usage", func() bool {
		rep = usage.Report{}
		if err := d.Client.Usage(ctxT(t), map[string][]string{"since": {"1h"}}, &rep); err != nil {
			t.Fatal(err)
		}
		for _, u := range rep.Sandboxes {
			if u.SandboxID == sb.ID() && u.State == "killed" {
				return true
			}
		}
		return false
	})
	var u usage.Usage
	for _, x := range rep.Sandboxes {
		if x.SandboxID == sb.ID() {
			u = x
		}
	}
	t.Logf("usage %+v; the loop used %.2f CPU-s by the shell, %.2f by the usage; memory held %.1f s of a %.1f s life", u, childCPU, burnt, heldFor, life)
	if childCPU < 0.2 {
		t.Fatalf("the loop got only %.2f CPU-s: the host is too busy to measure", childCPU)
	}
	if burnt < 0.7*childCPU || burnt > 1.3*childCPU {
		t.Errorf("CPU-seconds over the loop %.2f, want within 30%% of the loop's own %.2f", burnt, childCPU)
	}
	if u.CPUSeconds < burnt {
		t.Errorf("CPU-seconds %.2f at the kill, less than the loop's %.2f", u.CPUSeconds, burnt)
	}
	// 100 MiB held for heldFor seconds, the readings 5 s apart: at least
	// what was held after the first reading; at most the whole life at
	// 100 MiB plus 100 MiB of everything else.
	lo, hi := 100.0/1024*(heldFor-5)*0.9, 200.0/1024*life
	if u.MemoryGiBSeconds < lo || u.MemoryGiBSeconds > hi {
		t.Errorf("GiB-seconds %.3f, want %.3f to %.3f", u.MemoryGiBSeconds, lo, hi)
	}
	if u.EgressBytesIn < n || u.EgressBytesIn > n+1<<20 || u.EgressBytesOut <= 0 || u.EgressBytesOut > 1<<20 {
		t.Errorf("egress in %d out %d, want %d in (plus headers) and a little out", u.EgressBytesIn, u.EgressBytesOut, n)
	}
	if u.RunningSeconds < heldFor || u.RunningSeconds > life+1 || u.PausedSeconds != 0 || u.IdleSeconds > u.RunningSeconds {
		t.Errorf("running %.1f s, paused %.1f s, idle %.1f s; want running within [%.1f, %.1f]", u.RunningSeconds, u.PausedSeconds, u.IdleSeconds, heldFor, life+1)
	}
	if !strings.HasPrefix(u.Actor, "team:") || !strings.Contains(u.Actor, " key:") {
		t.Errorf("actor %q, want the API key's team and holder", u.Actor)
	}
	var key *usage.KeyUsage
	for i := range rep.Keys {
		if rep.Keys[i].Actor == u.Actor {
			key = &rep.Keys[i]
		}
	}
	if key == nil || key.CPUSeconds < u.CPUSeconds || key.EgressBytesIn < u.EgressBytesIn {
		t.Errorf("key totals %+v do not cover the sandbox", key)
	}
	m := d.do(t, "GET", "/metrics", d.Key, nil, nil)
	metric := func(name string) float64 {
		for _, l := range strings.Split(string(m.Body), "\n") {
			if rest, ok := strings.CutPrefix(l, name+"{key=\""+u.Actor+"\""); ok {
				f := strings.Fields(rest)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				return v
			}
		}
		t.Errorf("/metrics has no %s for %s", name, u.Actor)
		return 0
	}
	if v := metric("fence_usage_cpu_seconds_total"); v < u.CPUSeconds*0.99 {
		t.Errorf("fence_usage_cpu_seconds_total %v < the sandbox's %v", v, u.CPUSeconds)
	}
	if v := metric("fence_usage_memory_gib_seconds_total"); v < u.MemoryGiBSeconds*0.99 {
		t.Errorf("fence_usage_memory_gib_seconds_total %v < the sandbox's %v", v, u.MemoryGiBSeconds)
	}
	if strings.Contains(string(m.Body), sb.ID()) {
		t.Errorf("/metrics names a sandbox")
	}
	if v := metric("fence_usage_egress_bytes_total"); v <= 0 {
		t.Errorf("fence_usage_egress_bytes_total %v", v)
	}
}

// parseTimes reads the second line of sh's `times` ("0m1.23s 0m0.01s",
// the children's user and system time) and returns their sum in seconds.
func parseTimes(t *testing.T, line string) float64 {
	t.Helper()
	var total float64
	for _, f := range strings.Fields(line) {
		m, s, ok := strings.Cut(strings.TrimSuffix(f, "s"), "m")
		if !ok {
			t.Fatalf("times: %q", line)
		}
		mi, err1 := strconv.ParseFloat(m, 64)
		se, err2 := strconv.ParseFloat(s, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("times: %q", line)
		}
		total += mi*60 + se
	}
	return total
}
