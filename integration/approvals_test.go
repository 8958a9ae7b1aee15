package integration

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/approvals"
)

// heldCurl is curl with room for a lookup held for a decision.
const heldCurl = "curl -sS --connect-timeout 30 -m 30 "

// pendingFor waits for a pending approval request of sandbox id for name.
func pendingFor(t *testing.T, d *daemon, id, name string) approvals.Request {
	t.Helper()
	var found approvals.Request
	eventually(t, 20*time.Second, "a pending approval request for "+name, func() bool {
		for _, r := range listApprovals(t, d) {
			if r.SandboxID == id && r.Name == name {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

func listApprovals(t *testing.T, d *daemon) []approvals.Request {
	t.Helper()
	resp := d.do(t, "GET", "/approvals", d.Key, nil, nil)
	if resp.Status != http.StatusOK {
		t.Fatalf("GET /approvals = %d %s", resp.Status, resp.Body)
	}
	var rs []approvals.Request
	if err := json.Unmarshal(resp.Body, &rs); err != nil {
		t.Fatal(err)
	}
	return rs
}

func decide(t *testing.T, d *daemon, id, decision string) rawResponse {
	t.Helper()
	return d.do(t, "POST", "/approvals/"+id, d.Key, strings.NewReader(`{"decision":"`+decision+`"}`), nil)
}

// held runs script in the sandbox in the background and returns its
// output and exit code once it ends. A run that fails t (its Run call
// failed, or ran past run's minute) answers "-1" rather than never.
func held(t *testing.T, e *client.Envd, script string) <-chan [2]string {
	ch := make(chan [2]string, 1)
	go func() {
		got := [2]string{"", "-1"}
		defer func() { ch <- got }() // also when t.Fatalf ends the goroutine
		out, code := attempt(t, e, script)
		got = [2]string{out, strconv.Itoa(code)}
	}()
	return ch
}

// metric returns the value of an unlabelled series on GET /metrics.
func metric(t *testing.T, d *daemon, name string) int64 {
	t.Helper()
	resp := d.do(t, "GET", "/metrics", d.Key, nil, nil)
	for _, l := range strings.Split(string(resp.Body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// pyNameFlood sends one A query for each of argv[1] distinct new names to the
// sandbox's resolver, without waiting for answers.
const pyNameFlood = `
import socket, struct, sys
ns = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')][0]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[1])):
    name = 'n%d.flood.test' % i
    hdr = struct.pack('>HHHHHH', i & 0xffff, 0x0100, 1, 0, 0, 0)
    body = b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0'
    try: s.sendto(hdr + body + struct.pack('>HH', 1, 1), (ns, 53))
    except OSError: pass
print('sent')
`

// TestApprovals: a sandbox with network approval "ask" holds a connection
// to a name off its allowlist until a decision through the API.
func TestApprovals(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	x := &netEnv{fn: fn, canary: newCanary(t)}
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr, "--approval-timeout", "4s")
	x.d = d
	ask := &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"allowed.test"}, Approval: "ask"}
	boxes := createAll(t, d, map[string]api.NewSandbox{
		"ask":   {TemplateID: "base", Network: ask},
		"flood": {TemplateID: "base", Network: ask},
	})
	sb := boxes["ask"]
	e := sb.Envd()

	t.Run("once", func(t *testing.T) {
		done := held(t, e, heldCurl+"http://other.test/once")
		r := pendingFor(t, d, sb.ID(), "other.test")
		if resp := decide(t, d, r.ID, "once"); resp.Status != http.StatusOK {
			t.Fatalf("POST once = %d %s", resp.Status, resp.Body)
		}
		if got := <-done; got[1] != "0" || !strings.Contains(got[0], "hello from wan") {
			t.Fatalf("held curl after once: %v", got)
		}
		if resp := decide(t, d, r.ID, "deny"); resp.Status != http.StatusNotFound {
			t.Errorf("second decision = %d, want 404", resp.Status)
		}
	})
	t.Run("fence approvals", func(t *testing.T) {
		// other.test is still granted once: another name.
		done := held(t, e, heldCurl+"http://files.pythonhosted.org/cli")
		r := pendingFor(t, d, sb.ID(), "files.pythonhosted.org")
		if out, errs, code := d.fenceCLI(t, nil, "approvals"); code != 0 || !strings.Contains(out, r.ID) || !strings.Contains(out, "files.pythonhosted.org") {
			t.Fatalf("fence approvals: exit %d, %q %q", code, out, errs)
		}
		if out, errs, code := d.fenceCLI(t, nil, "approvals", r.ID, "--decision", "once"); code != 0 || !strings.Contains(out, "once") {
			t.Fatalf("fence approvals ID --decision once: exit %d, %q %q", code, out, errs)
		}
		if got := <-done; got[1] != "0" || !strings.Contains(got[0], "hello from wan") {
			t.Fatalf("held curl after fence approvals: %v", got)
		}
	})
	t.Run("deny", func(t *testing.T) {
		dm := fn.dnsMark()
		m := fn.mark()
		done := held(t, e, heldCurl+"http://evil.test/deny")
		r := pendingFor(t, d, sb.ID(), "evil.test")
		if resp := decide(t, d, r.ID, "deny"); resp.Status != http.StatusOK {
			t.Fatalf("POST deny = %d %s", resp.Status, resp.Body)
		}
		if got := <-done; got[1] == "0" {
			t.Fatalf("held curl after deny succeeded: %v", got)
		}
		x.noUpstreamQuery(t, dm, "evil.test")
		if l := fn.since(m); len(l) > 0 {
			t.Errorf("the wan was reached after a deny: %v", l)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		before := metric(t, d, "fence_egress_approvals_timed_out_total")
		out, code := attempt(t, e, heldCurl+"http://rebind.test/timeout")
		if code == 0 {
			t.Fatalf("curl with nobody deciding succeeded: %s", out)
		}
		for _, r := range listApprovals(t, d) {
			if r.SandboxID == sb.ID() {
				t.Errorf("request left after its timeout: %+v", r)
			}
		}
		if after := metric(t, d, "fence_egress_approvals_timed_out_total"); after <= before {
			t.Errorf("timed-out requests %d -> %d", before, after)
		}
	})
	t.Run("an unknown decision is refused", func(t *testing.T) {
		done := held(t, e, heldCurl+"http://github.com/team")
		r := pendingFor(t, d, sb.ID(), "github.com")
		if resp := decide(t, d, r.ID, "everyone"); resp.Status != http.StatusBadRequest {
			t.Errorf("POST everyone = %d %s, want 400", resp.Status, resp.Body)
		}
		if resp := decide(t, d, r.ID, "deny"); resp.Status != http.StatusOK {
			t.Fatalf("POST deny after a refused decision = %d %s", resp.Status, resp.Body)
		}
		<-done
	})
	t.Run("sandbox", func(t *testing.T) {
		done := held(t, e, heldCurl+"http://pypi.org/first")
		r := pendingFor(t, d, sb.ID(), "pypi.org")
		if resp := decide(t, d, r.ID, "sandbox"); resp.Status != http.StatusOK {
			t.Fatalf("POST sandbox = %d %s", resp.Status, resp.Body)
		}
		if got := <-done; got[1] != "0" {
			t.Fatalf("held curl after sandbox: %v", got)
		}
		asked := metric(t, d, "fence_egress_approvals_asked_total")
		x.reached(t, e, curl+"http://pypi.org/second", "path=/second")
		if n := metric(t, d, "fence_egress_approvals_asked_total"); n != asked {
			t.Errorf("the next connection asked again (%d -> %d)", asked, n)
		}
		resp := d.do(t, "GET", "/sandboxes/"+sb.ID(), d.Key, nil, nil)
		var got api.SandboxDetail
		if err := json.Unmarshal(resp.Body, &got); err != nil || got.Network == nil || !slices.Contains(got.Network.AllowOut, "pypi.org") {
			t.Errorf("GET /sandboxes/%s network = %s", sb.ID(), resp.Body)
		}
	})
	t.Run("the sandbox cannot reach the approvals", func(t *testing.T) {
		allowed := metric(t, d, "fence_egress_approvals_allowed_total")
		done := held(t, e, heldCurl+"http://deb.debian.org/self")
		r := pendingFor(t, d, sb.ID(), "deb.debian.org")
		body := `{"decision":"once"}`
		for _, a := range append([]string{"10.0.2.2", "10.0.2.3", "10.0.2.1", "127.0.0.1", "localhost"}, hostAddrStrings(t)...) {
			u := "-g http://" + urlHost(a) + ":" + d.port()
			x.refused(t, e, curl+"-H 'X-API-Key: "+d.Key+"' "+u+"/approvals", noPackets)
			x.refused(t, e, curl+"-H 'X-API-Key: "+d.Key+"' -H 'Content-Type: application/json' -d '"+body+"' "+u+"/approvals/"+r.ID, noPackets)
		}
		decide(t, d, r.ID, "deny") // unless it timed out meanwhile
		if got := <-done; got[1] == "0" {
			t.Errorf("the held curl went through: %v", got)
		}
		if n := metric(t, d, "fence_egress_approvals_allowed_total"); n != allowed {
			t.Errorf("a request was allowed from inside the sandbox (%d -> %d)", allowed, n)
		}
	})
	t.Run("a flood of names is bounded", func(t *testing.T) {
		fb := boxes["flood"]
		refused := metric(t, d, "fence_egress_approvals_refused_total")
		out := sh(t, fb.Envd(), "python3 -c \""+pyNameFlood+"\" 10000")
		if !strings.Contains(out, "sent") {
			t.Fatalf("flood: %q", out)
		}
		var n int
		eventually(t, 20*time.Second, "the flood's requests", func() bool {
			n = 0
			for _, r := range listApprovals(t, d) {
				if r.SandboxID == fb.ID() {
					n++
				}
			}
			return n == 16 && metric(t, d, "fence_egress_approvals_refused_total") > refused
		})
		if p := metric(t, d, "fence_egress_approvals_pending"); p > 16 {
			t.Errorf("pending requests %d", p)
		}
		// The other sandbox is still served while the flood waits.
		x.reached(t, e, curl+"http://allowed.test/during-flood", "path=/during-flood")
		eventually(t, 20*time.Second, "the flood's requests to time out", func() bool {
			for _, r := range listApprovals(t, d) {
				if r.SandboxID == fb.ID() {
					return false
				}
			}
			return true
		})
	})
}

func hostAddrStrings(t *testing.T) []string {
	var out []string
	for _, a := range hostGlobalAddrs(t) {
		out = append(out, a.String())
	}
	return out
}
