package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/audit"
)

// floodScript sends refused requests (Host not the TLS server name, 60 kB
// paths) pipelined over kept-alive TLS connections, one at a time (a new
// one when the gateway closes one), until WANT answers were read or SECONDS
// passed, and prints how many answers it read, in how many seconds, over
// how many connections. Stopping on a count rather than a clock keeps the
// flood the same size on a slow or busy machine. One thread sends and
// reads, the socket non-blocking: an SSL socket written by one thread
// while another reads it (or closes it) can crash Python's ssl module
// (exit 139).
const floodScript = `python3 - <<'PY'
import select, socket, ssl, time
want, secs = int(%q), float(%q)
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
req = ("GET /" + "a" * 60000 + " HTTP/1.1\r\nHost: x.test\r\n\r\n").encode()
start = time.time()
stop = start + secs
total = conns = 0
def over():
    return total >= want or time.time() >= stop
while not over():
    conns += 1
    try:
        s = ctx.wrap_socket(socket.create_connection(("other.test", 443), timeout=10), server_hostname="other.test")
    except OSError:
        time.sleep(0.05)
        continue
    s.setblocking(False)
    out, tail = b"", b""
    try:
        while not over():
            if not out:
                out = req * 8
            r, w, _ = select.select([s], [s], [], 0 if s.pending() else 5)
            if not r and not w and not s.pending():
                break
            if w:
                try:
                    out = out[s.send(out):]
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
            if r or s.pending():
                try:
                    b = s.recv(1 << 16)
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    continue
                if not b:
                    break
                total += (tail + b).count(b"HTTP/1.1 421")
                tail = b[-16:]
    except OSError:
        pass
    s.close()
print(total, round(time.time() - start, 2), conns)
PY`

// TestAuditGatewayFlood: a sandbox that has the gateway refuse request
// after request over one connection gets its allowance of records and an
// audit.suppressed record counting the rest per host, with every refused
// request accounted for; another sandbox's refused request and commands
// are all recorded, and the log verifies. It logs the records stored per
// second of the flood.
func TestAuditGatewayFlood(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	dataDir := newDataDir(t)
	d := startDaemon(t, dataDir, "--dns-upstream", fn.DNS.Addr, "--upstream-ca", fn.CAFile)
	inspect := true
	net := &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"other.test"}, Inspect: &inspect}
	// Not d.create: the daemon is stopped before the cleanup, and takes
	// its sandboxes with it.
	create := func() *client.Sandbox {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		sb, err := d.Client.Create(ctx, api.NewSandbox{TemplateID: "base", Network: net})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	flooder, quiet := create(), create()
	// Three times the allowance's burst, so that most of the flood must
	// be counted rather than stored.
	const want, secs = 3000, 45.0
	out := sh(t, flooder.Envd(), fmt.Sprintf(floodScript, strconv.Itoa(want), strconv.FormatFloat(secs, 'f', -1, 64)))
	var answered, conns int
	var took float64
	if _, err := fmt.Sscan(out, &answered, &took, &conns); err != nil || answered < want {
		t.Fatalf("the flood got %q answers (answers, seconds, connections); want %d", out, want)
	}
	sh(t, quiet.Envd(), "curl -sk -o /dev/null -H 'Host: q.test' https://other.test/quiet; echo done")
	sh(t, flooder.Envd(), "echo after")
	d.Stop()

	exp, errs, code := runFence(t, nil, nil, "audit", "export", "--data-dir", dataDir)
	if code != 0 {
		t.Fatalf("export: %d %s", code, errs)
	}
	stored, quietReq, cmds, big := 0, 0, 0, 0
	var suppressed int64
	var summary string
	for _, l := range strings.Split(strings.TrimSpace(exp), "\n") {
		var r audit.Record
		if json.Unmarshal([]byte(l), &r) != nil {
			t.Fatalf("export line %q", l)
		}
		switch {
		case r.Type == audit.TypeGateway && r.Sandbox == flooder.ID():
			stored++
			if len(l) > 4<<10 {
				big++
			}
		case r.Type == audit.TypeGateway && r.Sandbox == quiet.ID():
			quietReq++
		case r.Type == audit.TypeProcStart:
			cmds++
		case r.Type == audit.TypeSuppressed && r.Sandbox == flooder.ID():
			var d struct {
				Total   int64
				Summary string
			}
			json.Unmarshal(r.Data, &d)
			suppressed += d.Total
			summary += d.Summary + "; "
		}
	}
	t.Logf("flood: %d refused requests answered in %.1f s (%.0f/s) over %d connections; %d records stored (%.0f/s), %d counted in summaries: %s",
		answered, took, float64(answered)/took, conns, stored, float64(stored)/took, suppressed, summary)
	if big > 0 {
		t.Errorf("%d gateway records over 4 KiB: fields are not capped", big)
	}
	if int64(stored)+suppressed < int64(answered) {
		t.Errorf("%d stored + %d suppressed < %d refused: records lost uncounted", stored, suppressed, answered)
	}
	// The burst, the refill over the flood (and the setup's slack).
	if limit := 1000 + int(100*(took+30)); stored > limit {
		t.Errorf("%d of the flooder's records stored, over its allowance (%d)", stored, limit)
	}
	if !strings.Contains(summary, "refused requests to x.test") {
		t.Errorf("summary %q", summary)
	}
	if quietReq != 1 || cmds < 3 {
		t.Errorf("the quiet sandbox's refused request (%d) or the commands (%d) missing", quietReq, cmds)
	}
	if _, errs, code := runFence(t, nil, nil, "audit", "verify", "--data-dir", dataDir); code != 0 {
		t.Errorf("verify: %d %s", code, errs)
	}
}
