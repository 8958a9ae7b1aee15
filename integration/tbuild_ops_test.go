package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// listedWithMeta lists sandboxes through the API (path with its query) and
// returns their IDs with their metadata.
func listedWithMeta(t *testing.T, d *daemon, path string) map[string]map[string]string {
	t.Helper()
	r := d.do(t, "GET", path, d.Key, nil, nil)
	if r.Status != 200 {
		t.Fatalf("GET %s: %d %s", path, r.Status, r.Body)
	}
	var list []api.ListedSandbox
	if err := json.Unmarshal(r.Body, &list); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	out := map[string]map[string]string{}
	for _, s := range list {
		out[s.SandboxID] = s.Metadata
	}
	return out
}

// A template build's sandboxes are left out of the API's sandbox lists,
// as E2B's are, while they run: GET /sandboxes and /v2/sandboxes do not
// show them, includeBuilds=true and a metadata filter on the build key
// do; a user's create cannot take the key to hide a sandbox.
func TestTemplateBuildSandboxesHidden(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	user := d.create(t, api.NewSandbox{TemplateID: "minimal"})

	spec := client.TemplateBuildSpec{FromTemplate: "minimal", Steps: steps("sleep 4")}
	tid, bid := buildTemplate(t, d, "hidden", spec)
	// Wait for the build sandbox to exist.
	var buildSB string
	deadline := time.Now().Add(60 * time.Second)
	for buildSB == "" && time.Now().Before(deadline) {
		for id, md := range listedWithMeta(t, d, "/v2/sandboxes?includeBuilds=true") {
			if md["fence.template-build"] == bid {
				buildSB = id
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if buildSB == "" {
		t.Fatal("no sandbox with metadata fence.template-build in GET /v2/sandboxes?includeBuilds=true while the build runs")
	}
	for _, p := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running,paused", "/v2/sandboxes?includeBuilds=false"} {
		got := listedWithMeta(t, d, p)
		if _, ok := got[buildSB]; ok {
			t.Errorf("GET %s lists the build sandbox %s", p, buildSB)
		}
		if _, ok := got[user.ID()]; !ok {
			t.Errorf("GET %s does not list the user's sandbox %s", p, user.ID())
		}
	}
	for _, p := range []string{"/sandboxes?includeBuilds=true", "/v2/sandboxes?metadata=fence.template-build%3D" + bid} {
		if _, ok := listedWithMeta(t, d, p)[buildSB]; !ok {
			t.Errorf("GET %s does not list the build sandbox %s", p, buildSB)
		}
	}
	if r := d.do(t, "GET", "/v2/sandboxes?includeBuilds=yes", d.Key, nil, nil); r.Status != 400 {
		t.Errorf("includeBuilds=yes: %d %s, want 400", r.Status, r.Body)
	}
	r := d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(`{"templateID":"minimal","metadata":{"fence.template-build":"x"}}`), nil)
	if r.Status != 400 || !strings.Contains(string(r.Body), "reserved") {
		t.Errorf("create with the build metadata key: %d %s, want 400 reserved", r.Status, r.Body)
	}
	st, logs := waitBuild(t, d, tid, bid)
	if st.Status != "ready" {
		t.Fatalf("build: %s (%+v)\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
}
