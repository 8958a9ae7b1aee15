package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/testutil"
)

// Volumes through `fence router`: a volume made through the router lives
// on one node, and its content API, its sandboxes, its get and delete go
// to that node; lists merge the nodes; a create mounting volumes of two
// nodes, or a volume no node holds, is a 400.
func TestScaleoutVolumes(t *testing.T) {
	testutil.RequireRoot(t)
	k, token, key := startCluster(t)
	templatesDir(t)
	nodes := map[string]*daemon{"node-a": startNode(t, k, "node-a", key), "node-b": startNode(t, k, "node-b", key)}
	r := startRouter(t, k, key, 0)
	eventually(t, 30*time.Second, "router sees 2 placeable nodes", func() bool {
		st, live, pl := r.health()
		return st == 200 && live == 2 && pl == 2
	})
	via := &daemon{t: t, URL: r.URL, Key: key, Client: client.New(r.URL, key)}
	onNode := map[string]string{cluster.HeaderToken: token}

	v := via.newVolume(t, "data", 8)
	owner, other := "", ""
	for name, d := range nodes {
		var vs []api.Volume
		if rr := d.do(t, "GET", "/volumes", key, nil, onNode); json.Unmarshal(rr.Body, &vs) != nil {
			t.Fatalf("GET /volumes on %s: %d %s", name, rr.Status, rr.Body)
		}
		if slices.ContainsFunc(vs, func(x api.Volume) bool { return x.VolumeID == v.VolumeID }) {
			owner = name
		} else {
			other = name
		}
	}
	if owner == "" || other == "" {
		t.Fatalf("volume %s: owner %q, other node %q", v.VolumeID, owner, other)
	}
	// A volume of the other node, made there directly.
	if rr := nodes[other].do(t, "POST", "/volumes", key, strings.NewReader(`{"name":"elsewhere","sizeMB":8}`), onNode); rr.Status != http.StatusCreated {
		t.Fatalf("POST /volumes on %s: %d %s", other, rr.Status, rr.Body)
	}
	if rr := via.do(t, "POST", "/volumes", key, strings.NewReader(`{"name":"elsewhere"}`), nil); rr.Status != http.StatusBadRequest ||
		!strings.Contains(string(rr.Body), "already exists") {
		t.Errorf("a name used on another node: %d %s, want 400", rr.Status, rr.Body)
	}

	if rr := via.content(t, v, "PUT", "file?path=/hello.txt", "through the router"); rr.Status != http.StatusCreated {
		t.Fatalf("content PUT through the router: %d %s", rr.Status, rr.Body)
	}
	if rr := via.content(t, v, "GET", "file?path=/hello.txt", ""); rr.Status != 200 || string(rr.Body) != "through the router" {
		t.Errorf("content GET through the router: %d %q", rr.Status, rr.Body)
	}
	if rr := via.content(t, api.VolumeAndToken{VolumeID: v.VolumeID, Token: "fvt1.forged.x"}, "GET", "file?path=/hello.txt", ""); rr.Status != http.StatusUnauthorized {
		t.Errorf("a forged token through the router: %d %s, want 401", rr.Status, rr.Body)
	}

	sb := via.create(t, api.NewSandbox{VolumeMounts: []api.VolumeMount{{Name: "data", Path: "/data"}}})
	if got := sb.ID()[:cluster.TagLen]; got != cluster.Tag(owner) {
		t.Errorf("sandbox %s placed on tag %s, want %s (%s, the volume's node)", sb.ID(), got, cluster.Tag(owner), owner)
	}
	if got := rsh(t, sb.Envd(), `cat /data/hello.txt`); got != "through the router" {
		t.Errorf("the file inside the sandbox: %q", got)
	}

	for _, c := range []struct {
		mounts []api.VolumeMount
		want   string
	}{
		{[]api.VolumeMount{{Name: "data", Path: "/a"}, {Name: "elsewhere", Path: "/b"}}, "different nodes"},
		{[]api.VolumeMount{{Name: "nope", Path: "/a"}}, "volume 'nope' not found"},
	} {
		b, _ := json.Marshal(api.NewSandbox{TemplateID: "minimal", VolumeMounts: c.mounts})
		if rr := via.do(t, "POST", "/sandboxes", key, strings.NewReader(string(b)), nil); rr.Status != http.StatusBadRequest ||
			!strings.Contains(string(rr.Body), c.want) {
			t.Errorf("create mounting %v: %d %s, want 400 %q", c.mounts, rr.Status, rr.Body, c.want)
		}
	}

	var listed []api.Volume
	if rr := via.do(t, "GET", "/volumes", key, nil, nil); json.Unmarshal(rr.Body, &listed) != nil || len(listed) != 2 {
		t.Errorf("GET /volumes through the router: %d %s, want both nodes' volumes", rr.Status, rr.Body)
	}
	var got api.VolumeAndToken
	if rr := via.do(t, "GET", "/volumes/"+v.VolumeID, key, nil, nil); json.Unmarshal(rr.Body, &got) != nil || got.Name != "data" {
		t.Errorf("GET /volumes/{id} through the router: %d %s", rr.Status, rr.Body)
	}
	if rr := via.do(t, "DELETE", "/volumes/"+v.VolumeID, key, nil, nil); rr.Status != http.StatusConflict {
		t.Errorf("DELETE of a mounted volume through the router: %d %s, want 409", rr.Status, rr.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := via.Client.Kill(ctx, sb.ID()); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if rr := via.do(t, "DELETE", "/volumes/"+v.VolumeID, key, nil, nil); rr.Status != http.StatusNoContent {
		t.Errorf("DELETE through the router: %d %s, want 204", rr.Status, rr.Body)
	}
	if rr := via.do(t, "GET", "/volumes/"+v.VolumeID, key, nil, nil); rr.Status != http.StatusNotFound {
		t.Errorf("GET of the deleted volume through the router: %d %s, want 404", rr.Status, rr.Body)
	}
}
