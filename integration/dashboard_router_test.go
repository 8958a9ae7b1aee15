package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// routerTeamKey makes a team and an API key of it through a router with
// the cluster's key.
func routerTeamKey(t *testing.T, base, key, name string) (team, keyID, teamKey string) {
	t.Helper()
	hdr := map[string]string{"X-API-Key": key, "Content-Type": "application/json"}
	st, b, err := httpDo("POST", base+"/admin/teams", []byte(`{"name":"`+name+`"}`), hdr)
	var tm struct{ TeamID string }
	if err != nil || st != http.StatusCreated || json.Unmarshal(b, &tm) != nil {
		t.Fatalf("POST /admin/teams through the router = %d %s %v", st, b, err)
	}
	st, b, err = httpDo("POST", base+"/admin/teams/"+tm.TeamID+"/api-keys", []byte(`{"name":"`+name+`"}`), hdr)
	var k api.CreatedTeamAPIKey
	if err != nil || st != http.StatusCreated || json.Unmarshal(b, &k) != nil {
		t.Fatalf("POST api-keys through the router = %d %s %v", st, b, err)
	}
	return tm.TeamID, k.ID, k.Key
}

// sessionIDs lists the sandbox IDs a dashboard session sees.
func sessionIDs(t *testing.T, base, cookie, csrf string) []string {
	t.Helper()
	st, b := sessionRequest(t, base, "GET", "/v2/sandboxes?state=running,paused", cookie, csrf, "", "")
	var l []struct{ SandboxID string }
	if st != http.StatusOK || json.Unmarshal([]byte(b), &l) != nil {
		t.Fatalf("GET /v2/sandboxes with a session = %d %s", st, b)
	}
	var ids []string
	for _, s := range l {
		ids = append(ids, s.SandboxID)
	}
	return ids
}

// TestScaleoutDashboard drives the dashboard through `fence router` in
// headless chromium, on a cluster of a real kube-apiserver, two nodes on
// one PostgreSQL database and two routers (--shared-database): sign-in
// with a team's key through router A, the team's sandboxes on both nodes
// appearing in the list without a reload, a terminal on the sandbox of
// the second node, the session taken by router B, the CSRF refusals, a
// wrong key and an expired session refused, another team's session
// seeing none of them, and a router with --no-ui serving no dashboard.
func TestScaleoutDashboard(t *testing.T) {
	testutil.RequireRoot(t)
	requireTemplate(t, "minimal")
	ctx, dialogs := startBrowser(t)
	shots := artifactsDir(t)
	k, _, key := startCluster(t)
	fn := newFakeNet(t)
	dsn := pgtest.New(t).Database(t)
	sealing := clusterKey(t)
	byTag := map[string]string{}
	for _, n := range []string{"node-a", "node-b"} {
		startNode(t, k, n, key, "--database", dsn, "--secrets-key", sealing, "--warm-pool", "0", "--dns-upstream", fn.DNS.Addr)
		byTag[cluster.Tag(n)] = n
	}
	ra := startRouter(t, k, key, 0, "--shared-database")
	rb := startRouter(t, k, key, 0, "--shared-database", "--ui-session-ttl", "8s")
	for _, r := range []*routerProc{ra, rb} {
		eventually(t, 60*time.Second, "router sees 2 placeable nodes", func() bool {
			st, live, pl := r.health()
			return st == 200 && live == 2 && pl == 2
		})
	}
	_, keyIDA, keyA := routerTeamKey(t, ra.URL, key, "alpha")
	_, _, keyB := routerTeamKey(t, ra.URL, key, "beta")

	// Sign-in through router A: a wrong key is refused on the page.
	step(t, ctx, "the sign-in page through the router", chromedp.Navigate(ra.URL+"/ui/"), chromedp.WaitVisible(chromedp.ID("apikey")),
		screenshot(shots, "login"))
	axeCheck(t, ctx, "sign-in")
	step(t, ctx, "a wrong key",
		chromedp.SendKeys(chromedp.ID("apikey"), "e2b_"+strings.Repeat("0", 40)),
		chromedp.Click(chromedp.CSS("#login-form button[type=submit]")),
		waitText("#login-error", "invalid API key"))
	signIn := func(key, keyID string) {
		t.Helper()
		step(t, ctx, "sign-in with a team's key",
			chromedp.Evaluate[chromedp.Void](`document.getElementById("apikey").value = ""`),
			chromedp.SendKeys(chromedp.ID("apikey"), key),
			chromedp.Click(chromedp.CSS("#login-form button[type=submit]")),
			chromedp.WaitVisible(chromedp.ID("sandbox-list")),
			waitText("#who", keyID))
	}
	signIn(keyA, keyIDA)
	axeCheck(t, ctx, "sandboxes")

	// The team's sandboxes, made through router B on both nodes, appear in
	// the list without a reload.
	cb := client.New(rb.URL, keyA)
	onNode := map[string]*client.Sandbox{}
	for i := 0; i < 30 && len(onNode) < 2; i++ {
		sb, err := cb.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal",
			Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"allowed.test"}}})
		if err != nil {
			t.Fatalf("create through router B: %v", err)
		}
		t.Cleanup(func() { _ = sb.Kill(context.Background()) })
		if n := byTag[sb.ID()[:cluster.TagLen]]; onNode[n] == nil {
			onNode[n] = sb
		}
	}
	if len(onNode) < 2 {
		t.Fatalf("30 creates placed sandboxes on %d node(s), want both", len(onNode))
	}
	for _, n := range []string{"node-a", "node-b"} {
		link := fmt.Sprintf(`a.sandbox-link[data-id=%q]`, onNode[n].ID())
		step(t, ctx, "the sandbox of "+n+" in the list", chromedp.WaitVisible(chromedp.CSS(link)))
	}
	step(t, ctx, "the list", screenshot(shots, "sandboxes"))

	// A terminal on the sandbox of the second node.
	sb := onNode["node-b"]
	step(t, ctx, "the sandbox page of node-b",
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`a.sandbox-link[data-id=%q]`, sb.ID()))), waitText("#sandbox-id", sb.ID()),
		chromedp.Click(chromedp.ID("open-terminal")), chromedp.WaitVisible(chromedp.CSS(`#terminal[data-pid]`)))
	terminalEcho(t, ctx)
	step(t, ctx, "the terminal", screenshot(shots, "sandbox"))
	// Its egress shows on the network sparkline.
	sh(t, sb.Envd(), "wget -q -O /dev/null http://allowed.test/raw")
	step(t, ctx, "the network sparkline",
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#metrics figcaption')].some(c => c.textContent.startsWith('Network out') && !c.textContent.includes('(0 B in all)'))`,
			chromedp.WithPollingTimeout(60*time.Second)),
		screenshot(shots, "sandbox-network"))
	axeCheck(t, ctx, "sandbox")

	// The browser's session, its CSRF token, and router B taking it.
	cookie, csrf := browserSession(t, ctx, ra.URL)
	seenA := sessionIDs(t, rb.URL, cookie, csrf)
	for _, sb := range onNode {
		if !strings.Contains(strings.Join(seenA, " "), sb.ID()) {
			t.Errorf("router B, with router A's session, lists %v: %s is missing", seenA, sb.ID())
		}
	}

	// CSRF: the cookie without the token, another Origin, and a page of
	// another origin posting with the browser's cookie change nothing.
	before := len(seenA)
	create := `{"templateID":"minimal"}`
	if st, b := sessionRequest(t, ra.URL, "POST", "/sandboxes", cookie, "", "", create); st != http.StatusForbidden {
		t.Errorf("POST /sandboxes with the cookie and no CSRF token = %d %s, want 403", st, b)
	}
	if st, b := sessionRequest(t, ra.URL, "POST", "/sandboxes", cookie, csrf, "http://evil.example", create); st != http.StatusForbidden {
		t.Errorf("POST /sandboxes from another Origin = %d %s, want 403", st, b)
	}
	crossOriginPost(t, ctx, ra.URL+"/sandboxes")
	if after := len(sessionIDs(t, ra.URL, cookie, csrf)); after != before {
		t.Errorf("the team has %d sandboxes after the CSRF attempts, had %d", after, before)
	}

	// An expired session is refused (router B's sessions live 8 s).
	short, shortCSRF, expires := uiLogin(t, rb.URL, keyA)
	if st, b := sessionRequest(t, rb.URL, "GET", "/v2/sandboxes", short, shortCSRF, "", ""); st != http.StatusOK {
		t.Fatalf("a fresh session = %d %s, want 200", st, b)
	}
	time.Sleep(time.Until(expires) + time.Second)
	for _, base := range []string{rb.URL, ra.URL} {
		if st, b := sessionRequest(t, base, "GET", "/v2/sandboxes", short, shortCSRF, "", ""); st != http.StatusUnauthorized {
			t.Errorf("an expired session at %s = %d %s, want 401", base, st, b)
		}
	}

	// Another team's session sees none of them, on the page or the API.
	cbB := client.New(ra.URL, keyB)
	sbB, err := cbB.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatalf("create for team beta: %v", err)
	}
	t.Cleanup(func() { _ = sbB.Kill(context.Background()) })
	cookieB, csrfB, _ := uiLogin(t, ra.URL, keyB)
	seenB := strings.Join(sessionIDs(t, ra.URL, cookieB, csrfB), " ")
	for _, sb := range onNode {
		if strings.Contains(seenB, sb.ID()) {
			t.Errorf("team beta's session lists team alpha's %s", sb.ID())
		}
	}
	if !strings.Contains(seenB, sbB.ID()) {
		t.Errorf("team beta's session lists %q, want its own %s", seenB, sbB.ID())
	}
	if st, _ := sessionRequest(t, ra.URL, "GET", "/sandboxes/"+onNode["node-b"].ID(), cookieB, csrfB, "", ""); st != http.StatusNotFound {
		t.Errorf("team beta's session reading team alpha's sandbox = %d, want 404", st)
	}
	step(t, ctx, "team beta's page",
		chromedp.Navigate(ra.URL+"/ui/#/sandboxes"), chromedp.WaitVisible(chromedp.ID("logout")),
		chromedp.Click(chromedp.ID("logout")), chromedp.WaitVisible(chromedp.ID("apikey")))
	signIn(keyB, "")
	step(t, ctx, "team beta's list", chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`a.sandbox-link[data-id=%q]`, sbB.ID()))),
		screenshot(shots, "sandboxes-beta"))
	var shown int
	step(t, ctx, "team alpha's sandboxes are not on beta's page",
		value(chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll('a.sandbox-link[data-id=%q], a.sandbox-link[data-id=%q]').length`,
			onNode["node-a"].ID(), onNode["node-b"].ID())), &shown))
	if shown != 0 {
		t.Errorf("team beta's page shows %d of team alpha's sandboxes", shown)
	}
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened", n)
	}

	// A router with --no-ui serves no dashboard and takes no session.
	off := startRouter(t, k, key, 0, "--shared-database", "--no-ui")
	if st, b, err := httpDo("GET", off.URL+"/ui/", nil, nil); err != nil || st != http.StatusNotFound {
		t.Errorf("GET /ui/ on a router with --no-ui = %d %s %v, want 404", st, b, err)
	}
	if st, b := sessionRequest(t, off.URL, "GET", "/v2/sandboxes", cookieB, csrfB, "", ""); st != http.StatusUnauthorized {
		t.Errorf("a session on a router with --no-ui = %d %s, want 401", st, b)
	}
}
