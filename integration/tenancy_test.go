package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestCrossTenantMatrix runs a daemon with two teams: the default team
// (the bootstrap key) and team b, whose API key is minted in the daemon's
// database before it starts. Every route is sent with team b's key and the
// default team's IDs (sandbox, snapshot, checkpoint, secret, built
// template names), and again with IDs that never existed: the answers are
// the same (the ID aside), 404 where the route names an object, and
// every object of the default team is unchanged afterwards.
func TestCrossTenantMatrix(t *testing.T) {
	dataDir := newDataDir(t)
	// As the daemon makes it: sandbox users traverse it.
	if err := os.MkdirAll(dataDir, 0o711); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(ctxT(t), filepath.Join(dataDir, "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	team, err := db.CreateTeam(ctxT(t), "team-b")
	if err != nil {
		t.Fatal(err)
	}
	keyB, _, err := db.MintAPIKey(ctxT(t), team.ID, "matrix")
	if err != nil {
		t.Fatal(err)
	}
	tokenB, _, err := db.Mint(ctxT(t), team.ID, store.KindAccessToken, "matrix", "")
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, dataDir)
	keyA := d.Key

	// The default team's objects.
	if r := d.do(t, "POST", "/secrets", keyA, strings.NewReader(`{"name":"tok","value":"value-of-a-0123456789"}`), nil); r.Status != http.StatusCreated {
		t.Fatalf("POST /secrets = %d %s", r.Status, r.Body)
	}
	var sec api.Secret
	if r := d.do(t, "GET", "/secrets/tok", keyA, nil, nil); r.Status != http.StatusOK || json.Unmarshal(r.Body, &sec) != nil {
		t.Fatalf("GET /secrets/tok = %d %s", r.Status, r.Body)
	}
	sbA := d.create(t, api.NewSandbox{Secrets: map[string]api.SecretBinding{"TOK": {Secret: "tok", Hosts: []string{"api.example.com"}}}})
	rsh(t, sbA.Envd(), `echo one > /a`)
	cp, err := d.Client.Checkpoint(ctxT(t), sbA.ID(), "first")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := d.Client.CreateSnapshot(ctxT(t), sbA.ID(), "snap-a")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.do(t, "DELETE", "/templates/"+snap.SnapshotID, keyA, nil, nil) })
	// Team b's own sandbox, for the routes that take a second ID.
	r := d.do(t, "POST", "/sandboxes", keyB, strings.NewReader(`{"templateID":"minimal","timeout":300}`), nil)
	var sbB api.Sandbox
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &sbB) != nil {
		t.Fatalf("team b's create = %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() { d.do(t, "DELETE", "/sandboxes/"+sbB.SandboxID, keyB, nil, nil) })
	// The default team's volume.
	var volA api.VolumeAndToken
	if r := d.do(t, "POST", "/volumes", keyA, strings.NewReader(`{"name":"vol-a","sizeMB":8}`), nil); r.Status != http.StatusCreated || json.Unmarshal(r.Body, &volA) != nil {
		t.Fatalf("POST /volumes = %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() { d.do(t, "DELETE", "/volumes/"+volA.VolumeID, keyA, nil, nil) })

	state := func() string {
		var b strings.Builder
		for _, p := range []string{"/sandboxes/" + sbA.ID(), "/sandboxes/" + sbA.ID() + "/checkpoints", "/snapshots",
			"/secrets/" + sec.SecretID, "/v2/sandboxes", "/templates", "/volumes"} {
			r := d.do(t, "GET", p, keyA, nil, nil)
			fmt.Fprintf(&b, "%s %d %s\n", p, r.Status, r.Body)
		}
		return b.String()
	}
	// The default team's built template.
	tplID, tplBuild := buildTemplate(t, d, "tpl-a", client.TemplateBuildSpec{FromTemplate: "minimal", Steps: steps("echo a > /tpl-a")})
	if st, lines := waitBuild(t, d, tplID, tplBuild); st.Status != "ready" {
		t.Fatalf("build of tpl-a = %s:\n%s", st.Status, strings.Join(lines, "\n"))
	}
	t.Cleanup(func() { d.do(t, "DELETE", "/templates/"+tplID, keyA, nil, nil) })
	before := state()

	const (
		noSandbox = "zzzzzzzzzzzzzzzzzzzz"
		noSecret  = "sec_0aaaaaaaaaaaaaaaaaaaaaaaaa"
	)
	// A snapshot ID of the same shape that never existed.
	noSnapshot := snap.SnapshotID[:len(snap.SnapshotID)-4] + "0000"
	if noSnapshot == snap.SnapshotID {
		noSnapshot = snap.SnapshotID[:len(snap.SnapshotID)-4] + "1111"
	}
	type route struct{ method, path, body string }
	same := func(rt route, ids map[string][2]string, want int) {
		t.Helper()
		fill := func(i int) string {
			s := rt.path + "\x00" + rt.body
			for k, v := range ids {
				s = strings.ReplaceAll(s, k, v[i])
			}
			return s
		}
		norm := func(b []byte, i int) string {
			s := string(b)
			for k, v := range ids {
				s = strings.ReplaceAll(s, v[i], k)
			}
			return s
		}
		send := func(i int) (int, string) {
			path, body, _ := strings.Cut(fill(i), "\x00")
			var rd *strings.Reader
			if body != "" {
				rd = strings.NewReader(body)
			}
			var r rawResponse
			if rd != nil {
				r = d.do(t, rt.method, path, keyB, rd, nil)
			} else {
				r = d.do(t, rt.method, path, keyB, nil, nil)
			}
			return r.Status, norm(r.Body, i)
		}
		code, got := send(0)
		mcode, missing := send(1)
		if code != mcode || got != missing || (want != 0 && code != want) {
			t.Errorf("%s %s (team b) with the default team's IDs = %d %s; with missing ones = %d %s; want the same %d",
				rt.method, rt.path, code, got, mcode, missing, want)
		}
	}
	sandboxIDs := map[string][2]string{"{id}": {sbA.ID(), noSandbox}}
	for _, rt := range []route{
		{"GET", "/sandboxes/{id}", ""},
		{"DELETE", "/sandboxes/{id}", ""},
		{"POST", "/sandboxes/{id}/timeout", `{"timeout":3600}`},
		{"POST", "/sandboxes/{id}/pause", ""},
		{"POST", "/sandboxes/{id}/resume", `{"timeout":60}`},
		{"POST", "/sandboxes/{id}/connect", `{"timeout":60}`},
		{"POST", "/v2/sandboxes/{id}/connect", `{"timeout":60}`},
		{"POST", "/sandboxes/{id}/refreshes", `{"duration":60}`},
		{"GET", "/sandboxes/{id}/metrics", ""},
		{"GET", "/sandboxes/{id}/downloads", ""},
		{"GET", "/sandboxes/{id}/logs", ""},
		{"GET", "/v2/sandboxes/{id}/logs", ""},
		{"GET", "/sandboxes/{id}/export", ""},
		{"POST", "/sandboxes/{id}/fork", `{"count":1}`},
		{"POST", "/sandboxes/{id}/snapshots", `{"name":"stolen"}`},
		{"POST", "/sandboxes/{id}/checkpoints", `{}`},
		{"GET", "/sandboxes/{id}/checkpoints", ""},
		{"POST", "/sandboxes/{id}/rewind", `{"checkpointID":"` + cp.CheckpointID + `"}`},
		{"GET", "/sandboxes/{id}/diff", ""},
		{"PUT", "/sandboxes/{id}/network", `{"allowOut":["example.com"],"denyOut":["ALL_TRAFFIC"]}`},
	} {
		same(rt, sandboxIDs, http.StatusNotFound)
	}
	// A's checkpoint on b's own sandbox is a missing checkpoint.
	same(route{"POST", "/sandboxes/" + sbB.SandboxID + "/rewind", `{"checkpointID":"{cp}"}`},
		map[string][2]string{"{cp}": {cp.CheckpointID, "cp_missing0000000000"}}, 0)
	same(route{"GET", "/sandboxes/" + sbB.SandboxID + "/diff?from={cp}", ""},
		map[string][2]string{"{cp}": {cp.CheckpointID, "cp_missing0000000000"}}, 0)
	secretIDs := map[string][2]string{"{id}": {sec.SecretID, noSecret}}
	for _, rt := range []route{
		{"GET", "/secrets/{id}", ""},
		{"POST", "/secrets/{id}", `{"value":"overwritten-by-b"}`},
		{"DELETE", "/secrets/{id}", ""},
	} {
		same(rt, secretIDs, http.StatusNotFound)
	}
	same(route{"GET", "/secrets/{id}", ""}, map[string][2]string{"{id}": {"tok", "nosuchname"}}, http.StatusNotFound)
	volumeIDs := map[string][2]string{"{id}": {volA.VolumeID, "00000000-0000-4000-8000-0000000000ff"}}
	for _, rt := range []route{{"GET", "/volumes/{id}", ""}, {"DELETE", "/volumes/{id}", ""}} {
		same(rt, volumeIDs, http.StatusNotFound)
	}
	same(route{"POST", "/sandboxes", `{"templateID":"minimal","volumeMounts":[{"name":"{id}","path":"/data"}]}`},
		map[string][2]string{"{id}": {"vol-a", "nosuchvol"}}, http.StatusBadRequest)
	// Team b may name its own volume as the default team's is named.
	if r := d.do(t, "POST", "/volumes", keyB, strings.NewReader(`{"name":"vol-a","sizeMB":8}`), nil); r.Status != http.StatusCreated {
		t.Errorf("team b's volume named as the default team's = %d %s", r.Status, r.Body)
	}
	// The default team's ID on the team routes: as an unknown team's
	// (E2B's 403 on the metrics routes, 404 elsewhere).
	teamIDs := map[string][2]string{"{id}": {tenancy.DefaultTeamID, "00000000-0000-4000-8000-00000000beef"}}
	for _, rt := range []struct {
		route
		want int
	}{
		{route{"GET", "/teams/{id}/metrics", ""}, http.StatusForbidden},
		{route{"GET", "/teams/{id}/metrics/max?metric=concurrent_sandboxes", ""}, http.StatusForbidden},
		{route{"GET", "/teams/{id}/limits", ""}, http.StatusNotFound},
		{route{"GET", "/teams/{id}/limits/usage", ""}, http.StatusNotFound},
		{route{"PUT", "/teams/{id}/limits", `{"concurrentSandboxes":1}`}, http.StatusNotFound},
		{route{"GET", "/usage?team={id}", ""}, http.StatusNotFound},
	} {
		same(rt.route, teamIDs, rt.want)
	}
	same(route{"POST", "/sandboxes", `{"templateID":"minimal","secrets":{"T":{"secret":"{id}","hosts":["x.example.com"]}}}`},
		map[string][2]string{"{id}": {"tok", "nosuchname"}}, http.StatusBadRequest)
	snapIDs := map[string][2]string{"{id}": {snap.SnapshotID, noSnapshot}}
	for _, rt := range []struct {
		route
		want int
	}{
		{route{"POST", "/sandboxes", `{"templateID":"{id}","timeout":30}`}, 0},
		{route{"GET", "/templates/{id}", ""}, http.StatusNotFound},
		{route{"DELETE", "/templates/{id}", ""}, http.StatusNotFound},
		{route{"PATCH", "/templates/{id}", `{"public":true}`}, http.StatusNotFound},
		{route{"GET", "/templates/{id}/tags", ""}, http.StatusNotFound},
		{route{"GET", "/templates/{id}/builds/b1/status", ""}, http.StatusNotFound},
		{route{"GET", "/templates/{id}/builds/b1/logs", ""}, http.StatusNotFound},
		{route{"GET", "/templates/{id}/builds/b1/logs/stream", ""}, http.StatusNotFound},
		{route{"GET", "/templates/{id}/files/0123abcd", ""}, http.StatusNotFound},
		{route{"POST", "/v2/templates/{id}/builds/b1", `{}`}, 0},
		{route{"POST", "/templates/tags", `{"target":"{id}","tags":["x"]}`}, 0},
		{route{"DELETE", "/templates/tags", `{"name":"{id}","tags":["x"]}`}, 0},
		{route{"GET", "/templates/aliases/{id}", ""}, http.StatusNotFound},
		{route{"PATCH", "/v2/templates/{id}", `{"public":true}`}, http.StatusNotFound},
	} {
		same(rt.route, snapIDs, rt.want)
	}
	same(route{"GET", "/templates/aliases/{id}", ""}, map[string][2]string{"{id}": {"snap-a", "nosuchsnap"}}, 0)

	// The default team's built template, by ID and by alias.
	for _, ids := range []map[string][2]string{
		{"{id}": {tplID, "zzzzzzzzzzzzzzzzzzzz"}, "{b}": {tplBuild, tplBuild}},
		{"{id}": {"tpl-a", "nosuchtpl"}, "{b}": {tplBuild, tplBuild}},
	} {
		for _, rt := range []struct {
			route
			want int
		}{
			{route{"POST", "/sandboxes", `{"templateID":"{id}","timeout":30}`}, 0},
			{route{"GET", "/templates/{id}", ""}, http.StatusNotFound},
			{route{"DELETE", "/templates/{id}", ""}, http.StatusNotFound},
			{route{"PATCH", "/templates/{id}", `{"public":true}`}, http.StatusNotFound},
			{route{"PATCH", "/v2/templates/{id}", `{"public":true}`}, http.StatusNotFound},
			{route{"GET", "/templates/{id}/tags", ""}, http.StatusNotFound},
			{route{"GET", "/templates/{id}/builds/{b}/status", ""}, http.StatusNotFound},
			{route{"GET", "/templates/{id}/builds/{b}/logs", ""}, http.StatusNotFound},
			{route{"GET", "/templates/{id}/builds/{b}/logs/stream", ""}, http.StatusNotFound},
			{route{"GET", "/templates/{id}/files/0123abcd", ""}, http.StatusNotFound},
			{route{"POST", "/v2/templates/{id}/builds/{b}", `{"fromTemplate":"minimal"}`}, http.StatusNotFound},
			{route{"POST", "/templates/tags", `{"target":"{id}:default","tags":["stolen"]}`}, http.StatusNotFound},
			{route{"DELETE", "/templates/tags", `{"name":"{id}","tags":["default"]}`}, http.StatusNotFound},
			{route{"GET", "/templates/aliases/{id}", ""}, http.StatusNotFound},
		} {
			same(rt.route, ids, rt.want)
		}
	}
	if r := d.do(t, "POST", "/v3/templates", keyB, strings.NewReader(`{"name":"tpl-a"}`), nil); r.Status != http.StatusConflict {
		t.Errorf("team b registering the default team's alias = %d %s, want 409", r.Status, r.Body)
	}
	same(route{"POST", "/sandboxes", `{"templateID":"{id}","timeout":30}`}, map[string][2]string{"{id}": {"snap-a", "nosuchsnap"}}, 0)

	// Another team's API key, by its ID.
	r = d.do(t, "POST", "/api-keys", keyA, strings.NewReader(`{"name":"second of a"}`), nil)
	var keyOfA api.CreatedTeamAPIKey
	if r.Status != http.StatusCreated || json.Unmarshal(r.Body, &keyOfA) != nil {
		t.Fatalf("POST /api-keys (default team) = %d %s", r.Status, r.Body)
	}
	bearer := map[string]string{"Authorization": "Bearer " + tokenB}
	for _, rt := range []route{{"PATCH", "/api-keys/{id}", `{"name":"renamed by b"}`}, {"DELETE", "/api-keys/{id}", ""}} {
		var got [2]string
		var code [2]int
		for i, id := range []string{keyOfA.ID, "00000000-0000-4000-8000-00000000dead"} {
			var body io.Reader
			if rt.body != "" {
				body = strings.NewReader(rt.body)
			}
			r := d.do(t, rt.method, strings.Replace(rt.path, "{id}", id, 1), "", body, bearer)
			code[i], got[i] = r.Status, strings.ReplaceAll(string(r.Body), id, "{id}")
		}
		if code[0] != http.StatusNotFound || code != [2]int{code[1], code[1]} || got[0] != got[1] {
			t.Errorf("%s %s (team b's token) with the default team's key ID = %d %s; with a missing one = %d %s", rt.method, rt.path, code[0], got[0], code[1], got[1])
		}
	}
	for _, p := range []string{"/api-keys", "/teams", "/access-tokens"} {
		r := d.do(t, "GET", p, "", nil, bearer)
		if r.Status != http.StatusOK || strings.Contains(string(r.Body), keyOfA.ID) || strings.Contains(string(r.Body), tenancy.DefaultTeamID) {
			t.Errorf("GET %s (team b's token) = %d %s", p, r.Status, r.Body)
		}
	}
	if r := d.do(t, "GET", "/sandboxes", keyOfA.Key, nil, nil); r.Status != http.StatusOK {
		t.Errorf("the default team's second key after team b's attempts = %d %s", r.Status, r.Body)
	}

	// Lists leave the default team's objects out.
	for _, p := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=running,paused", "/snapshots", "/secrets",
		"/templates", "/v2/templates", "/sandboxes/metrics?sandbox_ids=" + sbA.ID(), "/usage", "/usage?sandbox=" + sbA.ID(), "/volumes"} {
		r := d.do(t, "GET", p, keyB, nil, nil)
		if r.Status != http.StatusOK {
			t.Errorf("GET %s (team b) = %d %s", p, r.Status, r.Body)
		}
		for _, id := range []string{sbA.ID(), snap.SnapshotID, sec.SecretID, cp.CheckpointID, keyOfA.ID, tenancy.DefaultTeamID, volA.VolumeID} {
			if strings.Contains(string(r.Body), id) {
				t.Errorf("GET %s (team b) shows the default team's %s: %s", p, id, r.Body)
			}
		}
	}
	// The audit trail: team b's own requests (naming the IDs it sent) and
	// its sandbox's records, none of the default team's.
	var recs []struct {
		Sandbox, Actor, Type string
	}
	if r := d.do(t, "GET", "/audit?limit=1000", keyB, nil, nil); r.Status != http.StatusOK || json.Unmarshal(r.Body, &recs) != nil || len(recs) == 0 {
		t.Errorf("GET /audit (team b) = %d %s", r.Status, r.Body)
	}
	for _, rec := range recs {
		if rec.Sandbox == sbA.ID() || !(strings.HasPrefix(rec.Actor, "team:"+team.ID+" ") || rec.Sandbox == sbB.SandboxID) {
			t.Errorf("GET /audit (team b) shows %+v", rec)
		}
	}
	for _, p := range []string{"/metrics"} {
		if r := d.do(t, "GET", p, keyB, nil, nil); r.Status != http.StatusForbidden && r.Status != http.StatusUnauthorized && r.Status != http.StatusNotFound {
			t.Errorf("GET %s (team b) = %d %s, want it refused", p, r.Status, r.Body)
		}
	}
	// Team b's own secret of the same name is its own.
	if r := d.do(t, "POST", "/secrets", keyB, strings.NewReader(`{"name":"tok","value":"value-of-b-0123456789"}`), nil); r.Status != http.StatusCreated {
		t.Errorf("team b's secret named as the default team's = %d %s, want 201", r.Status, r.Body)
	}

	// Team b's own snapshot, named as the default team's: its own, listed
	// for team b alone, and the default team's untouched (state, below).
	r = d.do(t, "POST", "/sandboxes/"+sbB.SandboxID+"/snapshots", keyB, strings.NewReader(`{"name":"snap-a"}`), nil)
	var snapB api.SnapshotInfo
	if r.Status != http.StatusCreated && r.Status != http.StatusOK || json.Unmarshal(r.Body, &snapB) != nil {
		t.Fatalf("team b's snapshot = %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() { d.do(t, "DELETE", "/templates/"+snapB.SnapshotID, keyB, nil, nil) })
	for k, want := range map[string]int{keyA: 1, keyB: 1} {
		var list []api.SnapshotInfo
		if r := d.do(t, "GET", "/snapshots", k, nil, nil); r.Status != http.StatusOK || json.Unmarshal(r.Body, &list) != nil || len(list) != want {
			t.Errorf("GET /snapshots = %d %s, want the team's own snapshot alone", r.Status, r.Body)
		}
	}
	// A create of team b's from "snap-a" boots team b's snapshot, which
	// has none of the default team's files.
	fromSnap, err := client.New(d.URL, keyB, client.WithHTTPClient(httpClientFor(d.URL))).Create(ctxT(t), api.NewSandbox{TemplateID: "snap-a"})
	if err != nil {
		t.Fatalf("team b's create from its own snap-a: %v", err)
	}
	if got := rsh(t, fromSnap.Envd(), `test -e /a && cat /a; true`); got != "" {
		t.Errorf("team b's sandbox from its snap-a has the default team's /a: %q", got)
	}
	if err := fromSnap.Kill(ctxT(t)); err != nil {
		t.Error(err)
	}

	// The admin's view by team: counts, and a kill of team b's sandboxes
	// that leaves the default team's running.
	var counts map[string]int
	if r := d.do(t, "GET", "/admin/sandboxes/running-counts", keyA, nil, nil); r.Status != http.StatusOK || json.Unmarshal(r.Body, &counts) != nil ||
		counts[team.ID] != 1 || counts[tenancy.DefaultTeamID] != 1 {
		t.Errorf("running counts = %d %s, want one sandbox of each team", r.Status, r.Body)
	}
	if r := d.do(t, "POST", "/admin/teams/"+team.ID+"/sandboxes/kill", keyB, nil, nil); r.Status == http.StatusOK {
		t.Errorf("team b's key killing through the admin route = %d %s, want it refused", r.Status, r.Body)
	}
	if r := d.do(t, "POST", "/admin/teams/"+team.ID+"/sandboxes/kill", keyA, nil, nil); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"killedCount":1`) {
		t.Errorf("kill team b's sandboxes = %d %s, want one killed", r.Status, r.Body)
	}
	if r := d.do(t, "GET", "/sandboxes/"+sbB.SandboxID, keyB, nil, nil); r.Status != http.StatusNotFound {
		t.Errorf("team b's sandbox after the kill = %d %s", r.Status, r.Body)
	}

	if after := state(); after != before {
		t.Errorf("the default team's objects changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := rsh(t, sbA.Envd(), `cat /a`); got != "one\n" {
		t.Errorf("the default team's sandbox's /a = %q", got)
	}
}
