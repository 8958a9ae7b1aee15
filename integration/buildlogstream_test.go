package integration

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/fencesandbox/fence/client"
)

// TestBuildLogStream follows a real template build through GET
// …/builds/{buildID}/logs/stream: the first step's output arrives in an
// earlier event than the second's (the lines stream as they are written),
// and the stream ends after the event of the finished build.
func TestBuildLogStream(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	tid, bid := buildTemplate(t, d, "streamed", client.TemplateBuildSpec{FromTemplate: "minimal",
		Steps: steps("echo first-line-out", "sleep 2 && echo second-line-out")})
	req, err := http.NewRequestWithContext(ctxT(t), "GET", d.URL+"/templates/"+tid+"/builds/"+bid+"/logs/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", d.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET …/logs/stream = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	firstAt, secondAt, events := -1, -1, 0
	var last struct {
		Status     string
		LogEntries []struct{ Message string }
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if err := json.Unmarshal([]byte(data), &last); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		for _, e := range last.LogEntries {
			if strings.Contains(e.Message, "first-line-out") && firstAt < 0 {
				firstAt = events
			}
			if strings.Contains(e.Message, "second-line-out") && secondAt < 0 {
				secondAt = events
			}
		}
		events++
	}
	if last.Status != "ready" {
		t.Fatalf("the stream ended at status %q, want ready", last.Status)
	}
	if firstAt < 0 || secondAt <= firstAt {
		t.Errorf("first step's output in event %d, second's in %d (of %d): want both, the first earlier", firstAt, secondAt, events)
	}
	// The build's page shows its lines, read from the stream.
	ctx, _ := startBrowser(t)
	shots := artifactsDir(t)
	step(t, ctx, "the build's page",
		chromedp.Navigate(d.URL+"/ui/"), chromedp.WaitVisible(chromedp.ID("apikey")),
		chromedp.SendKeys(chromedp.ID("apikey"), d.Key), chromedp.Click(chromedp.CSS("#login-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.ID("sandbox-list")),
		chromedp.Navigate(d.URL+"/ui/#/templates/"+tid+"/"+bid),
		waitText("#build-logs", "second-line-out"), waitText("main", "status: ready"),
		screenshot(shots, "build-logs"))
	axeCheck(t, ctx, "build logs")

	if r := d.do(t, "GET", "/templates/"+tid+"/builds/00000000-0000-4000-8000-000000000000/logs/stream", d.Key, nil, nil); r.Status != http.StatusBadRequest {
		t.Errorf("the stream of an unknown build = %d %s, want 400", r.Status, r.Body)
	}
}
