package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// chromium returns Debian's chromium (scripts/setup.sh installs it): a
// skip outside CI when it is missing, a failure under CI=true.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (scripts/setup.sh installs it)")
	}
	t.Skip("chromium is not installed (scripts/setup.sh installs it)")
	return ""
}

// artifactsDir is where a browser test keeps its screenshots:
// $FENCE_TEST_ARTIFACTS/<test>, else /var/tmp/fence-test-artifacts/<test>
// (kept after the test, unlike t.TempDir).
func artifactsDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv("FENCE_TEST_ARTIFACTS")
	if base == "" {
		base = "/var/tmp/fence-test-artifacts"
	}
	dir := filepath.Join(base, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	failDir = dir
	return dir
}

// startBrowser starts a headless chromium and returns its tab's context;
// dialogs counts the JavaScript dialogs (alert, confirm) the pages open.
func startBrowser(t *testing.T) (ctx context.Context, dialogs *atomic.Int32) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // the tests run as root
		chromedp.WindowSize(1280, 1400),
		chromedp.Flag("disable-gpu", true),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelA)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	dialogs = &atomic.Int32{}
	err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			dialogs.Add(1)
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		case *runtime.EventExceptionThrown:
			t.Logf("page exception: %s %v", ev.ExceptionDetails.Text, ev.ExceptionDetails.Exception)
		}
	})
	if err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx, dialogs
}

// step runs actions with a minute's bound and fails t naming what.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		if shot, _ := chromedp.Run(ctx, chromedp.FullScreenshot(100)); len(shot) > 0 {
			_ = os.WriteFile(filepath.Join(failDir, strings.ReplaceAll(t.Name(), "/", "_")+"-failure.png"), shot, 0o644)
		}
		body, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
		t.Fatalf("%s: %v\npage text:\n%s", what, err, body)
	}
}

// failDir keeps the screenshot of a failed step (artifactsDir sets it).
var failDir = os.TempDir()

// value runs a that gives a value, into *v.
func value[T any](a chromedp.Action[T], v *T) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		r, err := a(ctx, t)
		*v = r
		return err
	})
}

// waitText waits until the text of sel contains want.
func waitText(sel, want string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.innerText.includes(%q); })()`, sel, want),
		chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(80*time.Second))
}

func screenshot(dir, name string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		b, err := chromedp.FullScreenshot(100)(ctx, t) // 100: PNG
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, name+".png"), b, 0o644)
	})
}

// axeCheck injects axe-core (testdata/axe.min.js, pinned in
// internal/ui/web) and fails t on any serious or critical violation.
func axeCheck(t *testing.T, ctx context.Context, pageName string) {
	t.Helper()
	src, err := os.ReadFile("testdata/axe.min.js")
	if err != nil {
		t.Fatal(err)
	}
	var res []axeViolation
	step(t, ctx, "axe on "+pageName,
		chromedp.Evaluate[chromedp.Void](string(src)),
		value(chromedp.Evaluate[[]axeViolation](`axe.run(document, {resultTypes: ['violations']}).then(r => r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical'))`,
			chromedp.EvalAwaitPromise), &res))
	for _, v := range res {
		t.Errorf("axe on %s: %s (%s): %s; nodes %v", pageName, v.ID, v.Impact, v.Help, v.Nodes)
	}
}

type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target []any `json:"target"`
	} `json:"nodes"`
}

// teamKey makes a team and an API key of it with the daemon's key.
func teamKey(t *testing.T, d *daemon) (team, keyID, key string) {
	t.Helper()
	r := d.do(t, "POST", "/admin/teams", d.Key, strings.NewReader(`{"name":"dash"}`), nil)
	var tm struct{ TeamID string }
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &tm) != nil {
		t.Fatalf("POST /admin/teams = %d %s", r.Status, r.Body)
	}
	r = d.do(t, "POST", "/admin/teams/"+tm.TeamID+"/api-keys", d.Key, strings.NewReader(`{"name":"dash"}`), nil)
	var k api.CreatedTeamAPIKey
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &k) != nil {
		t.Fatalf("POST api-keys = %d %s", r.Status, r.Body)
	}
	return tm.TeamID, k.ID, k.Key
}

// sessionRequest sends a request with a dashboard session's cookie, and
// the CSRF token and Origin when not empty.
func sessionRequest(t *testing.T, base, method, path, cookie, csrf, origin, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctxT(t), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(&http.Cookie{Name: "fence_session", Value: cookie})
	if csrf != "" {
		req.Header.Set("X-Fence-CSRF", csrf)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// login signs in over HTTP and returns the session cookie and CSRF token.
func uiLogin(t *testing.T, base, key string) (cookie, csrf string, expires time.Time) {
	t.Helper()
	resp, err := http.Post(base+"/ui/session", "application/json", strings.NewReader(`{"apiKey":"`+key+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		CSRFToken string    `json:"csrfToken"`
		Expires   time.Time `json:"expires"`
	}
	if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&s) != nil {
		t.Fatalf("POST /ui/session = %d", resp.StatusCode)
	}
	for _, c := range resp.Cookies() {
		if c.Name == "fence_session" {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.MaxAge <= 0 {
				t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict and an expiry", c)
			}
			return c.Value, s.CSRFToken, s.Expires
		}
	}
	t.Fatal("POST /ui/session set no session cookie")
	return "", "", time.Time{}
}

func sandboxCount(t *testing.T, d *daemon, key string) int {
	t.Helper()
	r := d.do(t, "GET", "/v2/sandboxes?state=running,paused", key, nil, nil)
	var l []json.RawMessage
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &l) != nil {
		t.Fatalf("GET /v2/sandboxes = %d %s", r.Status, r.Body)
	}
	return len(l)
}

// terminalEcho types an echo of hello, split by an empty quote so that
// the command line differs from its output, in the open terminal, waits
// for hello on screen and checks the command shows too.
func terminalEcho(t *testing.T, ctx context.Context) {
	t.Helper()
	var onScreen string
	step(t, ctx, "echo hello in the terminal",
		chromedp.Focus(chromedp.CSS(".xterm-helper-textarea")),
		// Typed as one insertion (what an input method does): chromedp's
		// key events send each printable key twice (keyDown with text, then
		// char), which a terminal takes as two keystrokes.
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: "echo hel''lo"})
			return err
		}),
		chromedp.KeyEvent("\r"),
		chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('#terminal .xterm-rows > div')].some(r => r.textContent.trim() === 'hello')`,
			chromedp.WithPollingTimeout(60*time.Second)),
		value(chromedp.Text(chromedp.CSS("#terminal .xterm-rows")), &onScreen))
	if !strings.Contains(onScreen, "hel''lo") {
		t.Errorf("terminal shows %q, want the command typed and its output", onScreen)
	}
}

// browserSession returns the browser's session cookie for base (checked
// HttpOnly and SameSite=Strict) and, from the page, its CSRF token.
func browserSession(t *testing.T, ctx context.Context, base string) (cookie, csrf string) {
	t.Helper()
	var cookies []*network.Cookie
	step(t, ctx, "the session cookie", chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		r, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base}})
		cookies = r.Cookies
		return err
	}))
	for _, ck := range cookies {
		if ck.Name == "fence_session" {
			cookie = ck.Value
			if !ck.HTTPOnly || ck.SameSite != network.CookieSameSiteStrict {
				t.Errorf("session cookie %+v: want HttpOnly and SameSite=Strict", ck)
			}
		}
	}
	if cookie == "" {
		t.Fatal("the browser holds no fence_session cookie")
	}
	step(t, ctx, "the CSRF token", value(chromedp.Evaluate[string](`fetch('/ui/session').then(r => r.json()).then(s => s.csrfToken)`,
		chromedp.EvalAwaitPromise), &csrf))
	return cookie, csrf
}

// crossOriginPost has a page of another origin POST a create to target
// with the browser's cookies, as a CSRF attack would.
func crossOriginPost(t *testing.T, ctx context.Context, target string) {
	t.Helper()
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!doctype html><title>evil</title><script>
fetch(%q, {method: 'POST', mode: 'no-cors', credentials: 'include', headers: {'Content-Type': 'text/plain'}, body: '{"templateID":"minimal"}'})
  .then(() => document.title = 'sent', () => document.title = 'sent');
</script>`, target)
	}))
	defer evil.Close()
	step(t, ctx, "a request from another origin", chromedp.Navigate(evil.URL),
		chromedp.Poll[chromedp.Void](`document.title === 'sent'`, chromedp.WithPollingTimeout(30*time.Second)))
}

// dash is one run of TestDashboard: the browser, the daemon and a team's
// key.
type dash struct {
	t                *testing.T
	ctx              context.Context
	shots            string
	d                *daemon
	c                *client.Client
	team, keyID, key string
}

// TestDashboard drives the dashboard at /ui in headless chromium: sign-in
// with a team's key, a sandbox made over HTTP appearing live, its terminal,
// an upload (a file named as HTML among them, shown as text), a
// checkpoint, diff and rewind, the audit trail, every page's screenshot
// and axe-core's check; then the refusals (wrong key, CSRF, another
// origin, revoked key).

func TestDashboard(t *testing.T) {
	requireTemplate(t, "minimal")
	ctx, dialogs := startBrowser(t)
	x := &dash{t: t, ctx: ctx, shots: artifactsDir(t), d: startDaemon(t, newDataDir(t))}
	x.team, x.keyID, x.key = teamKey(t, x.d)
	x.c = client.New(x.d.URL, x.key)
	x.signIn()
	sb := x.sandboxAppears()
	x.terminal(sb)
	x.files(sb)
	x.checkpoints(sb)
	x.buttons(sb)
	x.auditAndApprovals()
	x.otherPages()
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened: a sandbox-controlled string ran as code", n)
	}
	cookie, csrf := x.csrf()
	x.sessionsEnd(cookie, csrf)
	x.adminAudit()
}

// signIn shows the sign-in page, refuses a wrong key and signs in with the team's.
func (x *dash) signIn() {
	t, ctx, d, shots, key, keyID := x.t, x.ctx, x.d, x.shots, x.key, x.keyID
	t.Helper()
	step(t, ctx, "the sign-in page", chromedp.Navigate(d.URL+"/ui/"), chromedp.WaitVisible(chromedp.ID("apikey")), screenshot(shots, "login"))
	axeCheck(t, ctx, "sign-in")

	// A wrong key is refused, and the page says so.
	step(t, ctx, "a wrong key",
		chromedp.SendKeys(chromedp.ID("apikey"), "e2b_"+strings.Repeat("0", 64)),
		chromedp.Click(chromedp.CSS("#login-form button[type=submit]")),
		waitText("#login-error", "invalid API key"))

	step(t, ctx, "sign-in with the team's key",
		chromedp.Evaluate[chromedp.Void](`document.getElementById("apikey").value = ""`),
		chromedp.SendKeys(chromedp.ID("apikey"), key),
		chromedp.Click(chromedp.CSS("#login-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.ID("sandbox-list")),
		waitText("#who", keyID))
	axeCheck(t, ctx, "sandboxes")
}

// sandboxAppears creates a sandbox over HTTP and waits for it in the list, which is not reloaded.
func (x *dash) sandboxAppears() *client.Sandbox {
	t, ctx, c, shots := x.t, x.ctx, x.c, x.shots
	t.Helper()
	// A sandbox made over HTTP appears without a reload.
	sb, err := c.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = sb.Kill(context.Background()) })
	link := fmt.Sprintf(`a.sandbox-link[data-id=%q]`, sb.ID())
	step(t, ctx, "the new sandbox in the list", chromedp.WaitVisible(chromedp.CSS(link)), screenshot(shots, "sandboxes"))

	return sb
}

// terminal opens the sandbox's page and terminal, runs a command and reads its output, and sees a refused flow among the live egress decisions.
func (x *dash) terminal(sb *client.Sandbox) {
	t, ctx := x.t, x.ctx
	t.Helper()
	// Its page and terminal: echo hello, read on screen.
	link := fmt.Sprintf(`a.sandbox-link[data-id=%q]`, sb.ID())
	step(t, ctx, "the sandbox page", chromedp.Click(chromedp.CSS(link)), waitText("#sandbox-id", sb.ID()),
		chromedp.Click(chromedp.ID("open-terminal")), chromedp.WaitVisible(chromedp.CSS(`#terminal[data-pid]`)))
	terminalEcho(t, ctx)

	// A refused flow shows among the sandbox's live egress decisions.
	e := sb.Envd()
	sh(t, e, "nc -w 2 198.51.100.7 80 </dev/null; true")
	step(t, ctx, "the refused flow on the page", waitText("#egress-list", "198.51.100.7"), waitText("#egress-list", "deny"))
}

// files uploads a file and one named as HTML, checks both inside the sandbox and as text on the page, and downloads the first back.
func (x *dash) files(sb *client.Sandbox) {
	t, ctx := x.t, x.ctx
	t.Helper()
	e := sb.Envd()
	// Uploads: a file, and one named as HTML, shown as text.
	xss := `<img src=x onerror=alert(1)>`
	local := t.TempDir()
	for name, body := range map[string]string{"note.txt": "before\n", xss: "x"} {
		if err := os.WriteFile(filepath.Join(local, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	step(t, ctx, "an upload",
		chromedp.SetUploadFiles(chromedp.ID("upload-input"), []string{filepath.Join(local, "note.txt")}),
		waitText("#files-list", "note.txt"),
		chromedp.SetUploadFiles(chromedp.ID("upload-input"), []string{filepath.Join(local, xss)}),
		waitText("#files-list", xss))
	if got := sh(t, e, "cat /tmp/note.txt"); got != "before\n" {
		t.Fatalf("/tmp/note.txt in the sandbox = %q, want what was uploaded", got)
	}
	if got := sh(t, e, "ls /tmp"); !strings.Contains(got, xss) {
		t.Fatalf("ls /tmp in the sandbox = %q, want the HTML-named file", got)
	}
	// A download through the browser gives the sandbox's file.
	downloads := t.TempDir()
	step(t, ctx, "a download",
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
				Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads})
			return err
		}),
		chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll('#files-list tr')].find(r => r.querySelector('.file-name')?.textContent === 'note.txt').querySelector('button').click()`))
	eventually(t, 30*time.Second, "the downloaded file", func() bool {
		b, err := os.ReadFile(filepath.Join(downloads, "note.txt"))
		return err == nil && string(b) == "before\n"
	})

	var imgs int
	step(t, ctx, "no element from a file name", value(chromedp.Evaluate[int](`document.querySelectorAll('#files-list img').length`), &imgs))
	if imgs != 0 {
		t.Errorf("the file list holds %d img elements: a file name was parsed as HTML", imgs)
	}
}

// checkpoints takes a checkpoint, changes a file, shows the diff and rewinds.
func (x *dash) checkpoints(sb *client.Sandbox) {
	t, ctx, shots := x.t, x.ctx, x.shots
	t.Helper()
	e := sb.Envd()
	// Checkpoint, change the file, the diff, rewind, the file back.
	step(t, ctx, "a checkpoint",
		chromedp.SendKeys(chromedp.ID("checkpoint-name"), "before"),
		chromedp.Click(chromedp.ID("checkpoint-button")),
		waitText("#checkpoint-list", "before"))
	sh(t, e, "echo after > /tmp/note.txt")
	step(t, ctx, "the diff since the checkpoint",
		chromedp.Click(chromedp.ID("diff-button")),
		waitText("#diff-result", "/tmp/note.txt"),
		screenshot(shots, "sandbox"))
	step(t, ctx, "rewind", chromedp.Click(chromedp.CSS("#checkpoint-list button.rewind")),
		waitText("#checkpoint-status", "Rewound"))
	if got := sh(t, e, "cat /tmp/note.txt"); got != "before\n" {
		t.Fatalf("/tmp/note.txt after the rewind = %q, want %q", got, "before\n")
	}
	axeCheck(t, ctx, "sandbox")
}

// buttons presses snapshot, fork, pause, resume and kill.
func (x *dash) buttons(sb *client.Sandbox) {
	t, ctx, d, c, key := x.t, x.ctx, x.d, x.c, x.key
	t.Helper()
	e := sb.Envd()
	// The buttons: snapshot, fork, pause, resume, kill.
	var forkID string
	step(t, ctx, "snapshot and fork",
		chromedp.Click(chromedp.ID("act-snapshot")), waitText("#sandbox-status", "Snapshot "),
		chromedp.Click(chromedp.ID("act-fork")), waitText("#sandbox-status", "Forked: "),
		value(chromedp.Text(chromedp.CSS("#sandbox-status a")), &forkID))
	t.Cleanup(func() { _ = c.Kill(context.Background(), forkID) })
	if r := d.do(t, "GET", "/sandboxes/"+forkID, key, nil, nil); r.Status != http.StatusOK {
		t.Errorf("the fork %q the page names = %d %s", forkID, r.Status, r.Body)
	}
	step(t, ctx, "pause and resume",
		chromedp.Click(chromedp.ID("act-pause")), waitText("#sandbox-status", "Paused."),
		chromedp.Click(chromedp.ID("act-resume")), waitText("#sandbox-status", "Resumed."))
	if got := sh(t, e, "cat /tmp/note.txt"); got != "before\n" {
		t.Fatalf("/tmp/note.txt after a pause and a resume = %q", got)
	}
	step(t, ctx, "kill", chromedp.Click(chromedp.ID("act-kill")), waitText("#sandbox-status", "Killed."))
	if r := d.do(t, "GET", "/v2/sandboxes?state=running,paused", key, nil, nil); strings.Contains(string(r.Body), sb.ID()) {
		t.Errorf("the killed sandbox is still listed: %s", r.Body)
	}
}

// auditAndApprovals checks the audit page, then denies a held egress lookup on the approvals page.
func (x *dash) auditAndApprovals() {
	t, ctx, d, c, shots := x.t, x.ctx, x.d, x.c, x.shots
	t.Helper()
	// The audit trail shows all of it.
	step(t, ctx, "the audit page", chromedp.Navigate(d.URL+"/ui/#/audit"), chromedp.WaitVisible(chromedp.CSS("#audit-records table")),
		waitText("#audit-records", "sandbox.create"), waitText("#audit-records", "file.write"),
		waitText("#audit-records", "sandbox.checkpoint"), waitText("#audit-records", "sandbox.rewind"),
		waitText("#audit-records", "process.start"),
		screenshot(shots, "audit"))
	axeCheck(t, ctx, "audit")
	// An egress approval waits on its page and is denied there.
	asker, err := c.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal",
		Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, Approval: "ask"}})
	if err != nil {
		t.Fatalf("Create with approval ask: %v", err)
	}
	t.Cleanup(func() { _ = asker.Kill(context.Background()) })
	step(t, ctx, "the approvals page", chromedp.Navigate(d.URL+"/ui/#/approvals"), waitText("#approval-list", "Nothing waits"))
	done := held(t, asker.Envd(), "nslookup held.test")
	step(t, ctx, "a pending approval", waitText("#approval-list", "held.test"), screenshot(shots, "approvals"))
	axeCheck(t, ctx, "approvals")
	step(t, ctx, "deny", chromedp.Click(chromedp.CSS("#approval-list button.danger")), waitText("#approval-list", "Nothing waits"))
	if got := <-done; got[1] == "0" {
		t.Errorf("the held lookup succeeded after a deny: %v", got)
	}
}

// otherPages screenshots and checks the remaining pages.
func (x *dash) otherPages() {
	t, ctx, d, shots := x.t, x.ctx, x.d, x.shots
	t.Helper()
	for _, p := range []string{"templates", "usage", "secrets"} {
		step(t, ctx, "the "+p+" page", chromedp.Navigate(d.URL+"/ui/#/"+p), chromedp.WaitVisible(chromedp.CSS("#page h1")),
			chromedp.Sleep(500*time.Millisecond), screenshot(shots, p))
		axeCheck(t, ctx, p)
	}
}

// csrf checks that the browser's cookie without the token, with another Origin, or sent by a page of another origin changes nothing; it returns the cookie and token.
func (x *dash) csrf() (string, string) {
	t, ctx, d, key := x.t, x.ctx, x.d, x.key
	t.Helper()
	// CSRF: the browser's own cookie without the token, with another
	// Origin, and from a page of another origin, changes nothing.
	cookie, csrf := browserSession(t, ctx, d.URL)
	before := sandboxCount(t, d, key)
	create := `{"templateID":"minimal"}`
	if st, b := sessionRequest(t, d.URL, "POST", "/sandboxes", cookie, "", "", create); st != http.StatusForbidden {
		t.Errorf("POST /sandboxes with the cookie and no CSRF token = %d %s, want 403", st, b)
	}
	if st, b := sessionRequest(t, d.URL, "POST", "/sandboxes", cookie, csrf, "http://evil.example", create); st != http.StatusForbidden {
		t.Errorf("POST /sandboxes from another Origin = %d %s, want 403", st, b)
	}
	if st, b := sessionRequest(t, d.URL, "GET", "/v2/sandboxes", cookie, csrf, "", ""); st != http.StatusOK {
		t.Errorf("GET /v2/sandboxes with the cookie and the token = %d %s, want 200", st, b)
	}
	crossOriginPost(t, ctx, d.URL+"/sandboxes")
	if after := sandboxCount(t, d, key); after != before {
		t.Errorf("the team has %d sandboxes after the CSRF attempts, had %d", after, before)
	}

	return cookie, csrf
}

// sessionsEnd signs out in the browser and revokes the key: both sessions end.
func (x *dash) sessionsEnd(cookie, csrf string) {
	t, ctx, d, key, keyID, team := x.t, x.ctx, x.d, x.key, x.keyID, x.team
	t.Helper()
	// Signing out ends the session; revoking the key ends the others.
	cookie2, csrf2, _ := uiLogin(t, d.URL, key)
	step(t, ctx, "sign out", chromedp.Navigate(d.URL+"/ui/#/sandboxes"), chromedp.WaitVisible(chromedp.ID("logout")),
		chromedp.Click(chromedp.ID("logout")), chromedp.WaitVisible(chromedp.ID("apikey")))
	if st, b := sessionRequest(t, d.URL, "GET", "/v2/sandboxes", cookie, csrf, "", ""); st != http.StatusUnauthorized {
		t.Errorf("a signed-out session = %d %s, want 401", st, b)
	}
	if st, _ := sessionRequest(t, d.URL, "GET", "/v2/sandboxes", cookie2, csrf2, "", ""); st != http.StatusOK {
		t.Fatalf("a second session = %d, want 200", st)
	}
	if r := d.do(t, "DELETE", "/admin/teams/"+team+"/api-keys/"+keyID, d.Key, nil, nil); r.Status != http.StatusNoContent {
		t.Fatalf("revoking the key = %d %s", r.Status, r.Body)
	}
	if st, b := sessionRequest(t, d.URL, "GET", "/v2/sandboxes", cookie2, csrf2, "", ""); st != http.StatusUnauthorized {
		t.Errorf("a session of a revoked key = %d %s, want 401", st, b)
	}
}

// adminAudit signs in with the daemon's key and sees the chain verified on the audit page.
func (x *dash) adminAudit() {
	t, ctx, d, shots := x.t, x.ctx, x.d, x.shots
	t.Helper()
	// The daemon's key sees the chain verified on the audit page.
	step(t, ctx, "the audit page of the daemon's key",
		chromedp.SendKeys(chromedp.ID("apikey"), d.Key), chromedp.Click(chromedp.CSS("#login-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.ID("sandbox-list")), chromedp.Navigate(d.URL+"/ui/#/audit"),
		waitText("#audit-verify", "Intact: "), waitText("#audit-verify", "signed checkpoints, the last at seq"),
		screenshot(shots, "audit-admin"))
}

// TestDashboardSessionExpiry: a session is refused once its time is up,
// and `fence serve --no-ui` serves no dashboard.
func TestDashboardSessionExpiry(t *testing.T) {
	d := startDaemon(t, newDataDir(t), "--ui-session-ttl", "10s")
	cookie, csrf, expires := uiLogin(t, d.URL, d.Key)
	if st, b := sessionRequest(t, d.URL, "GET", "/v2/sandboxes", cookie, csrf, "", ""); st != http.StatusOK {
		t.Fatalf("a fresh session = %d %s, want 200", st, b)
	}
	time.Sleep(time.Until(expires) + time.Second)
	if st, b := sessionRequest(t, d.URL, "GET", "/v2/sandboxes", cookie, csrf, "", ""); st != http.StatusUnauthorized {
		t.Errorf("an expired session = %d %s, want 401", st, b)
	}
	d.Stop()

	off := startDaemon(t, newDataDir(t)+"-off", "--no-ui")
	if r := off.do(t, "GET", "/ui/", "", nil, nil); r.Status != http.StatusNotFound {
		t.Errorf("GET /ui/ with --no-ui = %d, want 404", r.Status)
	}
	if r := off.do(t, "POST", "/ui/session", "", strings.NewReader(`{"apiKey":"`+off.Key+`"}`), nil); r.Status == http.StatusCreated {
		t.Errorf("POST /ui/session with --no-ui = %d, want a refusal", r.Status)
	}
}
