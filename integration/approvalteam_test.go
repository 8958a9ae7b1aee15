package integration

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestApprovalTeamDecision: a "team" decision approves a name for every
// sandbox of the request's team, those running and those made after,
// which reach it without asking; another team's sandbox still asks; the
// decision is in the audit trail with who made it and the team. Root:
// namespaces, the fake internet.
func TestApprovalTeamDecision(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr, "--approval-timeout", "60s")
	r := d.do(t, "POST", "/admin/teams", d.Key, strings.NewReader(`{"name":"team-b"}`), nil)
	var teamB api.TeamInfo
	if r.Status != 201 || json.Unmarshal(r.Body, &teamB) != nil {
		t.Fatalf("POST /admin/teams = %d %s", r.Status, r.Body)
	}
	r = d.do(t, "POST", "/admin/teams/"+teamB.TeamID+"/api-keys", d.Key, strings.NewReader(`{"name":"b"}`), nil)
	var keyB api.CreatedTeamAPIKey
	if r.Status != 201 || json.Unmarshal(r.Body, &keyB) != nil {
		t.Fatalf("POST team b's key = %d %s", r.Status, r.Body)
	}
	ask := &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"allowed.test"}, Approval: "ask"}
	boxes := createAll(t, d, map[string]api.NewSandbox{"a1": {TemplateID: "base", Network: ask}, "a2": {TemplateID: "base", Network: ask}})
	b, err := client.New(d.URL, keyB.Key, client.WithHTTPClient(httpClientFor(d.URL))).Create(ctxT(t), api.NewSandbox{TemplateID: "base", Network: ask})
	if err != nil {
		t.Fatalf("team b's create: %v", err)
	}
	t.Cleanup(func() { _ = b.Kill(ctxT(t)) })

	pending := func(key, id, name string) approvals.Request {
		t.Helper()
		var found approvals.Request
		eventually(t, 30*time.Second, "a pending approval request for "+name, func() bool {
			var rs []approvals.Request
			if r := d.do(t, "GET", "/approvals", key, nil, nil); r.Status != 200 || json.Unmarshal(r.Body, &rs) != nil {
				t.Fatalf("GET /approvals = %d %s", r.Status, r.Body)
			}
			for _, r := range rs {
				if r.SandboxID == id && r.Name == name {
					found = r
					return true
				}
			}
			return false
		})
		return found
	}
	done := held(t, boxes["a1"].Envd(), heldCurl+"http://other.test/team")
	req := pending(d.Key, boxes["a1"].ID(), "other.test")
	if resp := decide(t, d, req.ID, "team"); resp.Status != http.StatusOK {
		t.Fatalf("POST team = %d %s", resp.Status, resp.Body)
	}
	if got := <-done; got[1] != "0" || !strings.Contains(got[0], "hello from wan") {
		t.Fatalf("held curl after team: %v", got)
	}

	// The team's other sandboxes, and one made afterwards, reach it
	// without a request (one would wait the 60 s timeout and fail the
	// curl's 30 s).
	a3 := d.create(t, api.NewSandbox{TemplateID: "base", Network: ask})
	for name, sb := range map[string]*client.Sandbox{"a2": boxes["a2"], "a3": a3} {
		if out, code := attempt(t, sb.Envd(), heldCurl+"http://other.test/team"); code != 0 || !strings.Contains(out, "hello from wan") {
			t.Errorf("%s after the team decision: exit %d %s", name, code, out)
		}
	}
	// Team b's sandbox still asks: its request waits, and a deny refuses it.
	doneB := held(t, b.Envd(), heldCurl+"http://other.test/team")
	reqB := pending(keyB.Key, b.ID(), "other.test")
	if resp := d.do(t, "POST", "/approvals/"+reqB.ID, keyB.Key, strings.NewReader(`{"decision":"deny"}`), nil); resp.Status != http.StatusOK {
		t.Fatalf("team b's deny = %d %s", resp.Status, resp.Body)
	}
	if got := <-doneB; got[1] == "0" {
		t.Fatalf("team b's sandbox reached a name approved for the default team: %v", got)
	}

	// The audit trail: the team decision, its team and who made it.
	eventually(t, 30*time.Second, "the team decision's audit record", func() bool {
		var recs []struct {
			Actor string
			Data  map[string]any
		}
		if r := d.do(t, "GET", "/audit?type=egress.approval&limit=1000", d.Key, nil, nil); r.Status != 200 || json.Unmarshal(r.Body, &recs) != nil {
			t.Fatalf("GET /audit = %d %s", r.Status, r.Body)
		}
		for _, rec := range recs {
			if rec.Data["decision"] == "team" && rec.Data["name"] == "other.test" && rec.Data["team"] == tenancy.DefaultTeamID &&
				rec.Actor == "team:"+tenancy.DefaultTeamID+" key:bootstrap" {
				return true
			}
		}
		return false
	})
}
