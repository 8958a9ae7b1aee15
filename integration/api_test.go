package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// hostSandboxes returns the IDs of the sandboxes of the daemon on dataDir
// that exist on the host, pooled ones included: one cgroup each (on
// cgroup v1 one per controller, counted once).
func hostSandboxes(dataDir string) map[string]bool {
	ids := map[string]bool{}
	for _, cg := range sandboxCgroups(instanceOf(dataDir)) {
		ids[filepath.Base(cg)] = true
	}
	return ids
}

// runnableSandboxes returns the IDs of the sandboxes on the host with a
// process that can still run: not a zombie, not exiting (PF_EXITING) and
// without SIGKILL pending. A killed sandbox whose cgroup waits for its
// background release is not one.
func runnableSandboxes(dataDir string) map[string]bool {
	ids := map[string]bool{}
	for _, cg := range sandboxCgroups(instanceOf(dataDir)) {
		b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && runnable(pid) {
				ids[filepath.Base(cg)] = true
				break
			}
		}
	}
	return ids
}

// runnable reports whether process pid can run again: not a zombie, not
// exiting, no SIGKILL pending. A sandbox rebooted (rewound, resumed) while
// its predecessor is released has the predecessor's init, SIGKILLed, in a
// cgroup of the same sandbox until it has exited.
func runnable(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 7 || fields[0] == "Z" || fields[0] == "X" {
		return false
	}
	const pfExiting = 0x4
	if flags, _ := strconv.ParseUint(fields[6], 10, 64); flags&pfExiting != 0 {
		return false
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<(9-1)) != 0 {
			return false // SIGKILL pending
		}
	}
	return true
}

// memoryLimit returns the memory limit of a sandbox's cgroup, in bytes.
func memoryLimit(dataDir, id string) (int64, error) {
	inst := instanceOf(dataDir)
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/fence", inst, id, "memory.max"),
		filepath.Join("/sys/fs/cgroup/memory/fence", inst, id, "memory.limit_in_bytes"),
	} {
		b, err := os.ReadFile(p)
		if err == nil {
			return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	return 0, fmt.Errorf("no memory cgroup for sandbox %s", id)
}

// TestWarmPoolBounds attacks the warm pool from the API: creates with
// unusual limits must not make the pool start sandboxes of those limits,
// and with --max-sandboxes 3 the sandboxes on the host (counted from
// their cgroups, pooled ones included) never exceed 3, while creates at
// the cap still succeed by taking a pooled sandbox's room. Root: the
// daemon creates namespaces, cgroups and mounts.
func TestWarmPoolBounds(t *testing.T) {
	const max = 3
	d := startDaemon(t, newDataDir(t), "--warm-pool", "2", "--max-sandboxes", strconv.Itoa(max))
	eventually(t, 60*time.Second, "the warm pool fills", func() bool { return len(hostSandboxes(d.DataDir)) == 2 })

	// Watch the host's count for the whole test.
	var peak atomic.Int64
	// A killed sandbox's cgroup stays while its release runs in the
	// background (bounded on its own); once none of its processes can run
	// again it no longer counts against --max-sandboxes.
	live := func() int64 { return int64(len(runnableSandboxes(d.DataDir))) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if n := live(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	stopWatch := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWatch()

	const oddMB = 333
	cpus, mem := 1.0, int64(oddMB)
	odd := d.create(t, api.NewSandbox{TemplateID: "minimal", CPUCount: &cpus, MemoryMB: &mem})
	// Give a pool for those limits every chance to appear.
	time.Sleep(2 * time.Second)
	var oddOnHost []string
	for id := range hostSandboxes(d.DataDir) {
		if lim, err := memoryLimit(d.DataDir, id); err == nil && lim == oddMB<<20 {
			oddOnHost = append(oddOnHost, id)
		}
	}
	if len(oddOnHost) != 1 || oddOnHost[0] != odd.ID() {
		t.Errorf("sandboxes with %d MiB on the host: %v, want only the one created (%s)", oddMB, oddOnHost, odd.ID())
	}

	// At the cap (1 running + 2 pooled): more creates, default and odd,
	// take room from the pool; the one past the cap is refused.
	d.create(t, api.NewSandbox{TemplateID: "base"})
	d.create(t, api.NewSandbox{TemplateID: "minimal", CPUCount: &cpus, MemoryMB: &mem})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "minimal"}); !errors.Is(err, api.ErrResourceExhausted) {
		if err == nil {
			sb.Kill(ctx)
		}
		t.Errorf("create past --max-sandboxes %d = %v, want resource exhausted", max, err)
	}
	// A kill frees room; the pool takes it back, and no more.
	if err := odd.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the pool takes the freed room", func() bool { return live() == max })
	time.Sleep(2 * time.Second)
	stopWatch()
	if p := peak.Load(); p > max {
		t.Errorf("the host held %d sandboxes at peak with --max-sandboxes %d", p, max)
	}
	t.Logf("peak sandboxes on the host: %d (--max-sandboxes %d, --warm-pool 2)", peak.Load(), max)
}

// TestHTTPServerTimeouts attacks the API server the slowloris way and
// checks that legitimate slow traffic still works: connections that drip
// their headers, stall a body or idle between requests are closed by the
// server, while an upload that keeps moving and a long output stream are
// not cut. The timeouts are shortened through hidden serve flags; the test
// asserts that connections close, not how fast. Root: the daemon creates
// sandboxes.
func TestHTTPServerTimeouts(t *testing.T) {
	const short = 500 * time.Millisecond
	d := startDaemon(t, newDataDir(t), "--http-header-timeout", short.String(),
		"--http-idle-timeout", short.String(), "--http-body-idle-timeout", short.String())
	addr := strings.TrimPrefix(d.URL, "http://")

	// closed reports whether the server closed c (reading until EOF or a
	// reset); the deadline is a hang guard.
	closed := func(c net.Conn) error {
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("still open after 60s")
		}
		return nil
	}

	t.Run("slow headers", func(t *testing.T) {
		const conns = 20
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, conns)
		for i := range conns {
			wg.Go(func() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				done := make(chan struct{})
				go func() { // drip one header byte every 50ms until refused
					defer close(done)
					msg := "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 10000)
					for j := range len(msg) {
						if _, err := c.Write([]byte{msg[j]}); err != nil {
							return
						}
						time.Sleep(50 * time.Millisecond)
					}
				}()
				if err := closed(c); err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
				}
				c.Close()
				<-done
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		t.Logf("%d slow-header connections closed by the server within %v", conns, time.Since(start).Round(time.Millisecond))
	})

	t.Run("stalled body", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Length: 1000\r\n\r\n{", d.Key)
		if err := closed(c); err != nil {
			t.Error(err)
		}
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		if err := closed(c); err != nil { // the answer, then the close
			t.Error(err)
		}
	})

	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	t.Run("upload that keeps moving", func(t *testing.T) {
		// 40 chunks, one every short/4: ten times the body idle bound.
		r := &slowReader{chunk: []byte(strings.Repeat("x", 1000) + "\n"), n: 40, every: short / 4}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		start := time.Now()
		if err := sb.Envd().WriteFile(ctx, "/tmp/slow.txt", r); err != nil {
			t.Fatalf("slow upload: %v", err)
		}
		t.Logf("upload took %v with a %v body idle bound", time.Since(start).Round(time.Millisecond), short)
		if out := sh(t, sb.Envd(), "wc -c < /tmp/slow.txt"); strings.TrimSpace(out) != "40040" {
			t.Errorf("uploaded size = %q, want 40040", out)
		}
	})
	t.Run("long stream", func(t *testing.T) {
		out, _, st := run(t, sb.Envd(), client.ProcessSpec{Cmd: "sh", Args: []string{"-c", "sleep 3; echo done"}})
		if st.ExitCode != 0 || out != "done\n" {
			t.Errorf("a 3s command with 500ms server timeouts: exit %d, %q", st.ExitCode, out)
		}
	})
}

// slowReader yields n copies of chunk, waiting every before each.
type slowReader struct {
	chunk []byte
	n     int
	every time.Duration
	left  []byte
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.left) == 0 {
		if r.n == 0 {
			return 0, io.EOF
		}
		time.Sleep(r.every)
		r.n--
		r.left = r.chunk
	}
	n := copy(p, r.left)
	r.left = r.left[n:]
	return n, nil
}

// pyHeaderEcho answers every request with the headers it received.
const pyHeaderEcho = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = str(self.headers).encode()
        self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
http.server.HTTPServer(('0.0.0.0', 8002), H).serve_forever()
`

// TestPortProxyCredentials: a server inside a sandbox (which fence does
// not trust) receives none of fence's credentials that a client sent
// along: API key, access and traffic tokens, routing headers, the API key
// as a Bearer token. Its own Authorization scheme passes. Root: the daemon
// creates sandboxes.
func TestPortProxyCredentials(t *testing.T) {
	requireTemplate(t, "base")
	d := startDaemon(t, newDataDir(t))
	sb := d.create(t, api.NewSandbox{TemplateID: "base", Network: &api.NetworkConfig{AllowPublicTraffic: new(false)}})
	tok := *sb.TrafficAccessToken
	startBackground(t, sb.Envd(), client.ProcessSpec{Cmd: "python3", Args: []string{"-c", pyHeaderEcho}})
	hdr := map[string]string{api.HeaderSandboxID: sb.ID(), api.HeaderSandboxPort: "8002", api.HeaderTrafficToken: tok,
		api.HeaderAPIKey: d.Key, api.HeaderAccessToken: "envd-token-sent-by-mistake"}
	eventually(t, 15*time.Second, "the header echo answering", func() bool {
		return d.do(t, "GET", "/", "", nil, hdr).Status == 200
	})
	for _, auth := range []string{"Bearer " + d.Key, "Bearer app-token"} {
		hdr["Authorization"] = auth
		r := d.do(t, "GET", "/", "", nil, hdr)
		got := strings.ToLower(string(r.Body))
		for _, secret := range []string{d.Key, tok, "envd-token-sent-by-mistake", "e2b-sandbox-id", "e2b-sandbox-port"} {
			if strings.Contains(got, strings.ToLower(secret)) {
				t.Errorf("the sandbox's server got %q:\n%s", secret, r.Body)
			}
		}
		if auth == "Bearer app-token" && !strings.Contains(got, "authorization: bearer app-token") {
			t.Errorf("the sandbox's own Authorization did not pass:\n%s", r.Body)
		}
	}
}
