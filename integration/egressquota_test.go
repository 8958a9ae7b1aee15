package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestTeamEgressQuota: a team's egress bytes of the day, once spent, end
// its sandboxes' open flows and refuse their new ones with the reason
// in the audit trail; the count holds over a restart, and raising the
// limit lets flows through again. Root: namespaces, the fake internet.
func TestTeamEgressQuota(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr)
	if r := d.putTeamLimits(t, tenancy.DefaultTeamID, `{"egressBytesPerDay":1000000}`); r.Status != http.StatusOK {
		t.Fatalf("PUT limits = %d %s", r.Status, r.Body)
	}
	nw := &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"allowed.test"}}
	// Killed before the restart, not at cleanup: the restarted daemon
	// listens elsewhere.
	boxes := map[string]*client.Sandbox{}
	for _, name := range []string{"slow", "fast"} {
		sb, err := d.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "base", Network: nw})
		if err != nil {
			t.Fatal(err)
		}
		boxes[name] = sb
	}
	slow, fast := boxes["slow"].Envd(), boxes["fast"].Envd()

	// A slow download stays open, under the limit, until the day is spent.
	long := held(t, slow, "curl -sS -m 300 --limit-rate 20k -o /tmp/long http://allowed.test/bench/bytes?n=100000000")
	eventually(t, 60*time.Second, "the slow download under way", func() bool {
		n, err := strconv.Atoi(strings.TrimSpace(rsh(t, slow, `stat -c %s /tmp/long 2>/dev/null || echo 0`)))
		return err == nil && n > 0
	})
	if out, code := attempt(t, fast, "curl -sS -o /dev/null http://allowed.test/bench/bytes?n=2000000"); code != 0 {
		t.Fatalf("the download that spends the day: exit %d %s", code, out)
	}
	// The flows recorded so far (their bytes are what the day was
	// charged), for a failure to say whether the spending download was
	// counted before the slow one was to end.
	flows := func() string {
		r := d.do(t, "GET", "/audit?type=egress.flow", d.Key, nil, nil)
		return fmt.Sprintf("%d %s", r.Status, r.Body)
	}
	select {
	case got := <-long:
		if got[1] == "0" {
			t.Fatalf("the slow download finished whole: %v", got)
		}
		if got[1] == "-1" {
			t.Errorf("the slow download ran past its run's minute after the team's egress was spent; flows recorded: %s", flows())
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("the slow download went on after the team's egress was spent; flows recorded: %s", flows())
	}
	refused := func(e string) {
		t.Helper()
		if out, code := attempt(t, boxes[e].Envd(), "curl -sS -m 20 http://allowed.test/"); code == 0 {
			t.Fatalf("a new flow of %s after the day was spent: %s", e, out)
		}
	}
	refused("fast")
	refused("slow")
	// A sandbox's flows reach the audit trail through its writer's
	// queue: the refusals are there soon, not at once.
	eventually(t, 30*time.Second, "a flow refused for "+egressSpentReason+" in the audit trail", func() bool {
		r := d.do(t, "GET", "/audit?type=egress.flow", d.Key, nil, nil)
		return r.Status == http.StatusOK && strings.Contains(string(r.Body), egressSpentReason)
	})

	for _, sb := range boxes {
		if err := sb.Kill(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	d.Stop()
	d.Restart()
	sb := d.create(t, api.NewSandbox{TemplateID: "base", Network: nw})
	if out, code := attempt(t, sb.Envd(), "curl -sS -m 20 http://allowed.test/"); code == 0 {
		t.Fatalf("a new flow after a restart, the day spent: %s", out)
	}
	if r := d.putTeamLimits(t, tenancy.DefaultTeamID, `{"egressBytesPerDay":0}`); r.Status != http.StatusOK {
		t.Fatalf("PUT limits = %d %s", r.Status, r.Body)
	}
	if out, code := attempt(t, sb.Envd(), "curl -sS -m 20 http://allowed.test/"); code != 0 || !strings.Contains(out, "hello from wan") {
		t.Fatalf("a flow without the limit: exit %d %s", code, out)
	}
}

// egressSpentReason is the reason a flow refused for its team's spent
// egress is recorded with.
const egressSpentReason = "egress-quota-spent"
