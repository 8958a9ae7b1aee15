package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencesandbox/fence/client/clienttest"
	fencedaemon "github.com/fencesandbox/fence/internal/daemon"
	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/router"
	"github.com/fencesandbox/fence/internal/sandbox"
)

// execute runs the CLI with args and stdin, and returns the exit code and
// output.
func execute(t *testing.T, deps Deps, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	root := Root(deps)
	var out, errb bytes.Buffer
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errb)
	code = Execute(t.Context(), root, args)
	return code, out.String(), errb.String()
}

func TestHelpTeachesWithExamples(t *testing.T) {
	cmds := [][]string{
		{}, {"serve"}, {"template", "build"}, {"run"}, {"sandbox", "create"}, {"sandbox", "list"},
		{"sandbox", "kill"}, {"sandbox", "timeout"}, {"exec"}, {"cp"}, {"bench"}, {"selftest"},
	}
	for _, c := range cmds {
		code, out, _ := execute(t, Deps{}, "", append(c, "--help")...)
		if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "fence ") {
			t.Errorf("fence %s --help = %d, output without examples:\n%s", strings.Join(c, " "), code, out)
		}
	}
	_, out, _ := execute(t, Deps{}, "", "--help")
	for _, hidden := range []string{"agent", "init", "probe", "bench-client"} {
		if strings.Contains(out, "\n  "+hidden+" ") {
			t.Errorf("fence --help lists hidden command %q", hidden)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"unknown command", []string{"nosuch"}},
		{"unknown flag", []string{"serve", "--nosuch"}},
		{"bad flag value", []string{"serve", "--cpus", "lots"}},
		{"missing command", []string{"run"}},
		{"bad env", []string{"run", "-e", "NOVALUE", "--", "true"}},
		{"bad bind", []string{"run", "-v", "/tmp", "--", "true"}},
		{"unknown template", []string{"template", "build", "ubuntu"}},
		{"timeout args", []string{"sandbox", "timeout", "id"}},
		{"bad duration", []string{"sandbox", "timeout", "id", "soon", "--api-key", "k"}},
		{"cp two hosts", []string{"cp", "a", "b", "--api-key", "k"}},
		{"unknown sandbox verb", []string{"sandbox", "nosuch"}},
		{"exec without command", []string{"exec", "--api-key", "k", "sbx1", "--"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, stderr := execute(t, Deps{NewLocal: failNewLocal, BuildTemplate: func(context.Context, string, string, string, bool, io.Writer) error { return nil }}, "", tt.args...)
			if code != 2 || !strings.HasPrefix(stderr, "fence: ") {
				t.Errorf("fence %v = %d, stderr %q; want 2 and \"fence: …\"", tt.args, code, stderr)
			}
		})
	}
}

func failNewLocal(context.Context, LocalOptions) (isolation.Sandbox, error) {
	return nil, errors.New("no sandbox in this test")
}

func TestErrorsExitOne(t *testing.T) {
	code, _, stderr := execute(t, Deps{NewLocal: failNewLocal}, "", "run", "--", "true")
	if code != 1 || stderr != "fence: starting sandbox: no sandbox in this test\n" {
		t.Errorf("fence run with a failing backend = %d, %q", code, stderr)
	}
	for _, args := range [][]string{{"serve"}, {"agent"}, {"init"}, {"bench"}, {"template", "build", "minimal"}} {
		code, _, stderr := execute(t, Deps{}, "", args...)
		if code != 1 || !strings.Contains(stderr, "not available in this build") {
			t.Errorf("fence %v without deps = %d, %q; want 1 and \"not available\"", args, code, stderr)
		}
	}
}

func TestServeOptions(t *testing.T) {
	var got fencedaemon.Config
	deps := Deps{Serve: func(ctx context.Context, o fencedaemon.Config) error { got = o; return nil }}
	t.Setenv("FENCE_API_KEY", "e2b_abc")
	if code, _, stderr := execute(t, deps, "", "serve"); code != 0 {
		t.Fatalf("fence serve = %d, %s", code, stderr)
	}
	want := fencedaemon.Config{
		Addr: "127.0.0.1:3000", DataDir: "/var/lib/fence", TemplatesDir: "/var/lib/fence/templates",
		APIKey: "e2b_abc", Domain: "localhost",
		Defaults:     sandbox.Defaults{CPUs: 1, MemoryMB: 512, Pids: 1024, DiskMB: 1024, NoFile: 1024, Timeout: 5 * time.Minute},
		MaxSandboxes: 1000, WarmPool: 2, LayerFSSize: 32 << 30, MaxLifetime: 24 * time.Hour,
		// The code interpreter's pool, kept when the template is built.
		WarmTemplates: []fencedaemon.WarmTemplate{{Name: "code-interpreter", Size: 1, IfBuilt: true}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fence serve options = %+v, want %+v", got, want)
	}
	code, _, _ := execute(t, deps, "", "serve", "--addr", ":9", "--data-dir", "/d", "--domain", "example.test",
		"--cpus", "0.5", "--memory-mb", "64", "--pids", "10", "--disk-mb", "8", "--nofile", "99", "--timeout", "1h", "--max-sandboxes", "3", "--warm-pool", "0",
		"--layer-fs", "btrfs", "--layer-fs-size", "2G", "--tune-kernel", "--net-mbps", "8", "--http-idle-timeout", "3s",
		"--warm-template", "code-interpreter=2", "--idle-pause", "10m", "--max-lifetime", "0")
	want = fencedaemon.Config{
		Addr: ":9", DataDir: "/d", TemplatesDir: "/d/templates", APIKey: "e2b_abc", Domain: "example.test",
		Defaults:     sandbox.Defaults{CPUs: 0.5, MemoryMB: 64, Pids: 10, DiskMB: 8, NoFile: 99, Timeout: time.Hour, IdleTimeout: 10 * time.Minute},
		MaxLifetime:  -1,
		MaxSandboxes: 3, LayerFS: "btrfs", LayerFSSize: 2 << 30, TuneKernel: true,
		NetBandwidth: 1_000_000, HTTP: fencedaemon.HTTPTimeouts{Idle: 3 * time.Second},
		WarmTemplates: []fencedaemon.WarmTemplate{{Name: "code-interpreter", Size: 2}},
	}
	if code != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("fence serve with flags = %d, %+v, want %+v", code, got, want)
	}
	code, _, _ = execute(t, deps, "", "serve", "--database", "postgres://fence@db/fence", "--secrets-key", "/k")
	if code != 0 || got.Database != "postgres://fence@db/fence" || got.SecretsKey != "/k" {
		t.Errorf("fence serve --database = %d, %q, %q", code, got.Database, got.SecretsKey)
	}
	t.Setenv("FENCE_DATABASE_URL", "postgresql://fence:pw@db/fence")
	code, _, _ = execute(t, deps, "", "serve", "--secrets-key", "/k")
	if code != 0 || got.Database != "postgresql://fence:pw@db/fence" {
		t.Errorf("fence serve with $FENCE_DATABASE_URL = %d, %q", code, got.Database)
	}
	t.Setenv("FENCE_DATABASE_URL", "")
	for _, bad := range [][]string{{"--idle-pause", "-1s"}, {"--idle-pause", "100ms"}, {"--max-lifetime", "-1h"}, {"--max-lifetime", "1h", "--timeout", "2h"}, {"--layer-fs", "zfs"}, {"--layer-fs", "btrfs", "--layer-fs-size", "10M"}, {"--layer-fs-size", "lots"},
		{"--database", "mysql://db", "--secrets-key", "/k"}, {"--database", "postgres://db/fence"}} {
		if code, _, _ := execute(t, deps, "", append([]string{"serve"}, bad...)...); code != 2 {
			t.Errorf("fence serve %v = %d, want 2 (usage)", bad, code)
		}
	}
	if code, _, _ := execute(t, deps, "", "serve", "--memory-mb", "0"); code != 2 {
		t.Errorf("fence serve --memory-mb 0 = %d, want 2", code)
	}
	for arg, want := range map[string]int64{"2GiB": 2 << 30, "0": -1} {
		if code, _, stderr := execute(t, deps, "", "serve", "--audit-max-bytes", arg); code != 0 || got.AuditMaxBytes != want {
			t.Errorf("fence serve --audit-max-bytes %s = %d (%q), %d; want %d", arg, code, stderr, got.AuditMaxBytes, want)
		}
	}
	for _, bad := range []string{"lots", "-1G", "100K"} {
		if code, _, _ := execute(t, deps, "", "serve", "--audit-max-bytes", bad); code != 2 {
			t.Errorf("fence serve --audit-max-bytes %s = %d, want 2", bad, code)
		}
	}
	code, _, stderr := execute(t, deps, "", "serve", "--deny-cidr", "10.20.0.0/16", "--deny-cidr", "fd00:1::5/48", "--deny-cidr", "192.0.2.9")
	wantCIDRs := []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd00:1::/48"), netip.MustParsePrefix("192.0.2.9/32")}
	if code != 0 || !reflect.DeepEqual(got.DenyCIDRs, wantCIDRs) {
		t.Errorf("fence serve --deny-cidr ×3 = %d (%q), %v; want %v", code, stderr, got.DenyCIDRs, wantCIDRs)
	}
	for _, bad := range []string{"10.0.0.0/33", "nonsense", "", "fe80::1%eth0", "10.0.0.1/8/8"} {
		got = fencedaemon.Config{}
		code, _, stderr := execute(t, deps, "", "serve", "--deny-cidr", bad)
		if code != 2 || !strings.Contains(stderr, "--deny-cidr") || got.Addr != "" {
			t.Errorf("fence serve --deny-cidr %q = %d, %q; want a usage error naming the flag, and no serve", bad, code, stderr)
		}
	}
	t.Setenv("FENCE_CLUSTER_TOKEN", "tok")
	code, _, stderr = execute(t, deps, "", "serve", "--cluster-kubeconfig", "/k", "--cluster-node-name", "n1", "--cluster-advertise", "https://n1.test")
	wantCluster := &fencedaemon.ClusterOptions{Kubeconfig: "/k", Namespace: "fence", Name: "n1", URL: "https://n1.test", Token: "tok"}
	if code != 0 || !reflect.DeepEqual(got.Cluster, wantCluster) {
		t.Errorf("fence serve --cluster-… = %d (%q), %+v; want %+v", code, stderr, got.Cluster, wantCluster)
	}
	failing := Deps{Serve: func(context.Context, fencedaemon.Config) error { return errors.New("address in use") }}
	if code, _, stderr := execute(t, failing, "", "serve"); code != 1 || stderr != "fence: serving: address in use\n" {
		t.Errorf("fence serve failing = %d, %q", code, stderr)
	}
}

func TestTemplateBuild(t *testing.T) {
	var got []any
	deps := Deps{BuildTemplate: func(ctx context.Context, dataDir, tdir, name string, force bool, progress io.Writer) error {
		got = []any{dataDir, tdir, name, force}
		io.WriteString(progress, "progress\n")
		return nil
	}}
	code, stdout, stderr := execute(t, deps, "", "template", "build", "base", "--data-dir", "/d", "--force")
	if want := []any{"/d", "/d/templates", "base", true}; code != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("fence template build base = %d, %v, want %v", code, got, want)
	}
	if stdout != "" || stderr != "progress\n" {
		t.Errorf("fence template build: stdout %q stderr %q; want progress on stderr only", stdout, stderr)
	}
}

func TestBenchAndHidden(t *testing.T) {
	var bench BenchOptions
	var agent, initRan bool
	deps := Deps{
		Bench: func(ctx context.Context, o BenchOptions, out io.Writer) error {
			bench = o
			io.WriteString(out, "report\n")
			return nil
		},
		Agent:       func(context.Context) error { agent = true; return nil },
		SandboxInit: func() error { initRan = true; return nil },
	}
	code, out, _ := execute(t, deps, "", "bench", "--iterations", "5", "--peers", "--template", "base", "--data-dir", "/d")
	want := BenchOptions{Iterations: 5, Template: "base", DataDir: "/d", TemplatesDir: "/d/templates", Peers: true, NetMiB: 256}
	if code != 0 || bench != want || out != "report\n" {
		t.Errorf("fence bench = %d, %+v, %q; want %+v", code, bench, out, want)
	}
	code, _, _ = execute(t, deps, "", "bench", "--density", "20", "--net-mib", "0")
	if want := (BenchOptions{Iterations: 100, Template: "minimal", DataDir: DefaultDataDir, TemplatesDir: DefaultDataDir + "/templates", Density: 20}); code != 0 || bench != want {
		t.Errorf("fence bench --density 20 --net-mib 0 = %d, %+v; want %+v", code, bench, want)
	}
	for _, bad := range [][]string{{"--density", "-1"}, {"--net-mib", "-5"}, {"--iterations", "0"}} {
		if code, _, _ := execute(t, deps, "", append([]string{"bench"}, bad...)...); code != 2 {
			t.Errorf("fence bench %v = exit %d, want 2 (usage)", bad, code)
		}
	}
	var clientArgs []string
	deps.BenchClient = func(args []string, out io.Writer) error { clientArgs = args; return nil }
	if code, _, _ := execute(t, deps, "", "bench-client", "--addr", "x:1"); code != 0 || len(clientArgs) != 2 {
		t.Errorf("fence bench-client = %d, args %q", code, clientArgs)
	}
	if code, _, _ := execute(t, deps, "", "agent"); code != 0 || !agent {
		t.Errorf("fence agent = %d, called %v", code, agent)
	}
	if code, _, _ := execute(t, deps, "", "init", "--whatever"); code != 0 || !initRan {
		t.Errorf("fence init = %d, called %v", code, initRan)
	}
}

// localSandbox is an isolation.Sandbox whose agent is a clienttest.Agent.
type localSandbox struct {
	addr     string
	mu       sync.Mutex
	kills    int
	done     chan struct{}
	doneOnce sync.Once
}

func (s *localSandbox) ID() string { return "local1" }
func (s *localSandbox) DialAgent(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", s.addr)
}
func (s *localSandbox) Stats(context.Context) (isolation.Stats, error) { return isolation.Stats{}, nil }
func (s *localSandbox) Kill(context.Context) error {
	s.mu.Lock()
	s.kills++
	s.mu.Unlock()
	s.doneOnce.Do(func() { close(s.done) })
	return nil
}
func (s *localSandbox) Done() <-chan struct{} { return s.done }

func TestRun(t *testing.T) {
	dataDir := t.TempDir()
	hostDir := t.TempDir()
	tests := []struct {
		name       string
		stdin      string
		args       []string
		wantCode   int
		wantStdout string
	}{
		{"echo", "", []string{"echo", "hi", "there"}, 0, "hi there\n"},
		{"exit code", "", []string{"exit", "3"}, 3, ""},
		{"signal", "", []string{"kill"}, 137, ""},
		{"stdin", "abc", []string{"cat"}, 0, "abc"},
		{"no stdin", "abc", []string{"--no-stdin", "--", "cat"}, 0, ""},
		{"flags after cmd go to cmd", "", []string{"echo", "-e", "x"}, 0, "-e x\n"},
		{"env only from -e", "", []string{"-e", "A=1", "--", "env"}, 0, "A=1\n"},
		{"workdir", "", []string{"-w", "/tmp", "--", "pwd"}, 0, "/tmp\n"},
		{"user", "", []string{"--user", "root", "--", "whoami"}, 0, "root\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(clienttest.NewAgent())
			defer srv.Close()
			sb := &localSandbox{addr: srv.Listener.Addr().String(), done: make(chan struct{})}
			var opts LocalOptions
			deps := Deps{NewLocal: func(ctx context.Context, o LocalOptions) (isolation.Sandbox, error) {
				opts = o
				return sb, nil
			}}
			args := append([]string{"run", "--data-dir", dataDir, "-v", hostDir + ":/host:ro"}, tt.args...)
			code, stdout, stderr := execute(t, deps, tt.stdin, args...)
			if code != tt.wantCode || stdout != tt.wantStdout {
				t.Errorf("fence %v = %d, stdout %q, stderr %q; want %d, %q", args, code, stdout, stderr, tt.wantCode, tt.wantStdout)
			}
			if sb.kills != 1 {
				t.Errorf("fence %v killed the sandbox %d times, want 1", args, sb.kills)
			}
			wantBinds := []isolation.Bind{{HostPath: hostDir, Path: "/host", ReadOnly: true}}
			if opts.Template != "minimal" || opts.DataDir != dataDir || !reflect.DeepEqual(opts.Binds, wantBinds) {
				t.Errorf("fence %v local options = %+v", args, opts)
			}
		})
	}
}

func TestParseBind(t *testing.T) {
	dataDir := t.TempDir()
	host := t.TempDir()
	inData := filepath.Join(dataDir, "templates")
	os.Mkdir(inData, 0o755)
	linkToData := filepath.Join(host, "link")
	os.Symlink(inData, linkToData)
	linkToProc := filepath.Join(host, "proc")
	os.Symlink("/proc/self", linkToProc)
	sub := filepath.Join(host, "sub")
	os.Mkdir(sub, 0o755)
	rootOwned := filepath.Join(host, "root")
	os.Mkdir(rootOwned, 0o755)
	linkToEtc := filepath.Join(host, "etc")
	os.Symlink("/etc", linkToEtc)
	tmplDir := t.TempDir()
	// A developer's directories, and root's project (rootOwned): both
	// writable.
	for _, d := range []string{host, sub} {
		if err := os.Chown(d, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(host)
	tests := []struct {
		spec    string
		want    isolation.Bind
		wantErr bool
	}{
		{spec: host + ":/work", want: isolation.Bind{HostPath: host, Path: "/work"}},
		{spec: host + ":/work:ro", want: isolation.Bind{HostPath: host, Path: "/work", ReadOnly: true}},
		{spec: host + ":/work/:rw", want: isolation.Bind{HostPath: host, Path: "/work"}},
		{spec: "sub:/s", want: isolation.Bind{HostPath: sub, Path: "/s"}},
		{spec: "./sub/../sub:/s", want: isolation.Bind{HostPath: sub, Path: "/s"}},
		{spec: rootOwned + ":/r:ro", want: isolation.Bind{HostPath: rootOwned, Path: "/r", ReadOnly: true}},
		{spec: rootOwned + ":/r", want: isolation.Bind{HostPath: rootOwned, Path: "/r"}},
		{spec: rootOwned + ":/r:rw", want: isolation.Bind{HostPath: rootOwned, Path: "/r"}},
		{spec: "/etc:/e:ro", want: isolation.Bind{HostPath: "/etc", Path: "/e", ReadOnly: true}},
		{spec: linkToEtc + ":/e:ro", want: isolation.Bind{HostPath: "/etc", Path: "/e", ReadOnly: true}},
		{spec: "/etc:/e", wantErr: true},
		{spec: "/usr:/e", wantErr: true},
		{spec: "/root:/e", wantErr: true},
		{spec: linkToEtc + ":/e", wantErr: true},
		{spec: tmplDir + ":/t:ro", wantErr: true},
		{spec: "/run:/e:ro", wantErr: true},
		{spec: host, wantErr: true},
		{spec: host + ":work", wantErr: true},
		{spec: host + ":/", wantErr: true},
		{spec: host + ":/w:rx", wantErr: true},
		{spec: host + ":/w:ro:x", wantErr: true},
		{spec: ":/w", wantErr: true},
		{spec: filepath.Join(host, "missing") + ":/w", wantErr: true},
		{spec: "/:/host", wantErr: true},
		{spec: "/proc:/p", wantErr: true},
		{spec: "/proc/self:/p", wantErr: true},
		{spec: "/sys/kernel:/p", wantErr: true},
		{spec: "/dev/null:/p", wantErr: true},
		{spec: linkToProc + ":/p", wantErr: true},
		{spec: inData + ":/p", wantErr: true},
		{spec: dataDir + ":/p", wantErr: true},
		{spec: filepath.Dir(dataDir) + ":/p", wantErr: true}, // contains the data dir
		{spec: linkToData + ":/p", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseBind(tt.spec, dataDir, tmplDir)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("parseBind(%q) = %+v, %v; want %+v, error %v", tt.spec, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseEnv(t *testing.T) {
	tests := []struct {
		in      []string
		want    map[string]string
		wantErr bool
	}{
		{nil, nil, false},
		{[]string{"A=1", "B=x=y", "C="}, map[string]string{"A": "1", "B": "x=y", "C": ""}, false},
		{[]string{"HOME"}, nil, true},
		{[]string{"=v"}, nil, true},
	}
	for _, tt := range tests {
		got, err := parseEnv(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseEnv(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// The flags that parse straight into the daemon's Config read in --help
// as the plain string, int and repeatable flags they are to a user, and
// parse, map and refuse their values.
func TestServeFlagsParseIntoConfig(t *testing.T) {
	_, help, _ := execute(t, Deps{}, "", "serve", "--help")
	for _, want := range []string{
		"--layer-fs-size string ", `(default "32G")`, "--audit-max-bytes string ", "--forensics-budget string ",
		"--net-mbps int ", "--deny-cidr stringArray ", "--warm-template stringArray ",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("fence serve --help has no %q", want)
		}
	}
	if strings.Contains(help, "(default [])") || strings.Contains(help, `(default "")`) || strings.Contains(help, "--audit ") {
		t.Errorf("fence serve --help shows an empty default or the hidden --audit:\n%s", help)
	}
	var got fencedaemon.Config
	deps := Deps{Serve: func(ctx context.Context, c fencedaemon.Config) error { got = c; return nil }}
	if code, _, stderr := execute(t, deps, "", "serve", "--audit=false", "--forensics-budget", "500MiB", "--net-mbps", "100"); code != 0 ||
		!got.NoAudit || got.ForensicsBudget != 500<<20 || got.NetBandwidth != 12_500_000 {
		t.Errorf("fence serve --audit=false … = %d (%q), NoAudit %v, ForensicsBudget %d, NetBandwidth %d",
			code, stderr, got.NoAudit, got.ForensicsBudget, got.NetBandwidth)
	}
	if code, _, _ := execute(t, deps, "", "serve", "--audit"); code != 0 || got.NoAudit {
		t.Errorf("fence serve --audit = %d, NoAudit %v; want 0, false", code, got.NoAudit)
	}
	for _, bad := range [][]string{
		{"--net-mbps", "-1"}, {"--net-mbps", "fast"}, {"--forensics-budget", "0"}, {"--warm-template", "a=1", "--warm-template", "a=2"},
		{"--warm-template", "a=65"}, {"--warm-template", "a"},
	} {
		got = fencedaemon.Config{}
		code, _, stderr := execute(t, deps, "", append([]string{"serve"}, bad...)...)
		if code != 2 || !strings.Contains(stderr, bad[0]) || got.Addr != "" {
			t.Errorf("fence serve %v = %d, %q; want a usage error naming the flag, and no serve", bad, code, stderr)
		}
	}
}

// fence router's flags and environment parse into the router's Config.
func TestRouterConfig(t *testing.T) {
	var got router.Config
	deps := Deps{Router: func(ctx context.Context, c router.Config) error { got = c; return nil }}
	t.Setenv("FENCE_API_KEY", "e2b_abc")
	t.Setenv("FENCE_CLUSTER_TOKEN", "tok")
	code, _, stderr := execute(t, deps, "", "router", "--kubeconfig", "/k", "--addr", ":9", "--domain", "example.test",
		"--tls-cert", "c.pem", "--tls-key", "k.pem", "--node-ca", "ca.pem", "--shutdown-delay", "2s")
	want := router.Config{Addr: ":9", Kubeconfig: "/k", Namespace: "fence", APIKey: "e2b_abc", Token: "tok", Domain: "example.test",
		TLSCert: "c.pem", TLSKey: "k.pem", NodeCA: "ca.pem", ShutdownDelay: 2 * time.Second}
	if code != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("fence router = %d (%q), %+v; want %+v", code, stderr, got, want)
	}
	for _, bad := range [][]string{{}, {"--kubeconfig", "/k", "--in-cluster"}, {"--in-cluster", "--tls-cert", "c.pem"}, {"--in-cluster", "--shutdown-delay", "-1s"}} {
		got = router.Config{}
		if code, _, _ := execute(t, deps, "", append([]string{"router"}, bad...)...); code != 2 || got.Addr != "" {
			t.Errorf("fence router %v = %d; want 2 and no router", bad, code)
		}
	}
	failing := Deps{Router: func(context.Context, router.Config) error { return errors.New("address in use") }}
	if code, _, stderr := execute(t, failing, "", "router", "--in-cluster"); code != 1 || stderr != "fence: routing: address in use\n" {
		t.Errorf("fence router failing = %d, %q", code, stderr)
	}
}
