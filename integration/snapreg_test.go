package integration

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store/pgtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// TestServeSnapshotsThroughRegistry runs two nodes on one PostgreSQL
// database and one registry: a snapshot taken on node A is listed on
// node B and starts a sandbox there with A's files, pulled from the
// registry; a pull whose blobs are not their digests' bytes is refused
// and leaves no layer on the node; a snapshot deleted on B is gone on A.
func TestServeSnapshotsThroughRegistry(t *testing.T) {
	testutil.RequireRoot(t)
	dsn := pgtest.New(t).Database(t)
	key := clusterKey(t)
	reg := startRegistry(t)
	a := startDaemon(t, filepath.Join(testutil.StateDir(t), "a"), "--database", dsn, "--secrets-key", key, "--registry", reg.URL)
	b := startDaemon(t, filepath.Join(testutil.StateDir(t), "b"), "--database", dsn, "--secrets-key", key, "--registry", reg.URL)
	c := startDaemon(t, filepath.Join(testutil.StateDir(t), "c"), "--database", dsn, "--secrets-key", key, "--registry", reg.URL)

	src := a.create(t, api.NewSandbox{})
	sh(t, src.Envd(), `set -e; mkdir -p /home/user/work; echo "made on node a" > /home/user/work/note
		dd if=/dev/urandom of=/home/user/work/blob bs=1k count=256 2>/dev/null; sha256sum /home/user/work/blob > /home/user/work/blob.sum`)
	// A registry that refuses the push fails the snapshot: nothing
	// recorded, no layer kept.
	before, _ := layerDirs(a.DataDir)
	reg.refuse.Store(true)
	_, err := a.Client.CreateSnapshot(ctxT(t), src.ID(), "refused")
	reg.refuse.Store(false)
	if err == nil {
		t.Fatal("CreateSnapshot with a registry refusing the push succeeded")
	}
	if list, err := b.Client.ListSnapshots(ctxT(t), "", ""); err != nil || len(list) != 0 {
		t.Fatalf("ListSnapshots after a refused push = %+v, %v; want none", list, err)
	}
	if after, partial := layerDirs(a.DataDir); len(after) != len(before) || len(partial) > 0 {
		t.Fatalf("layers on a after a refused push: %v %v, before %v", after, partial, before)
	}
	sn, err := a.Client.CreateSnapshot(ctxT(t), src.ID(), "moved")
	if err != nil {
		t.Fatalf("CreateSnapshot on a: %v", err)
	}
	list, err := b.Client.ListSnapshots(ctxT(t), "", "")
	if err != nil || len(list) != 1 || list[0].SnapshotID != sn.SnapshotID {
		t.Fatalf("ListSnapshots on b = %+v, %v; want a's %s", list, err, sn.SnapshotID)
	}

	// A registry that serves other bytes than their digests name: the
	// create on c is refused and leaves no layer there.
	reg.corrupt.Store(true)
	r := c.do(t, "POST", "/sandboxes", c.Key, strings.NewReader(`{"templateID":"moved","timeout":60}`), nil)
	reg.corrupt.Store(false)
	if r.Status < 400 || !bytes.Contains(bytes.ToLower(r.Body), []byte("digest")) {
		t.Fatalf("create from the snapshot on c with a corrupting registry = %d %s; want an error naming the digest", r.Status, r.Body)
	}
	if complete, partial := layerDirs(c.DataDir); len(complete)+len(partial) > 0 {
		t.Fatalf("a refused pull left layers on c: %v %v", complete, partial)
	}

	moved := b.create(t, api.NewSandbox{TemplateID: "moved"})
	got := sh(t, moved.Envd(), `cat /home/user/work/note; cd /home/user/work && sha256sum -c blob.sum`)
	if want := "made on node a\n/home/user/work/blob: OK\n"; got != want {
		t.Fatalf("sandbox from a's snapshot on b sees %q, want %q", got, want)
	}
	if complete, _ := layerDirs(b.DataDir); len(complete) == 0 {
		t.Fatal("node b has no layer of the snapshot it started a sandbox from")
	}

	// A node without the snapshot's template (and no node that built it)
	// says which template it lacks, and pulls no layer.
	requireTemplate(t, "base")
	tdir := filepath.Join(testutil.StateDir(t), "templates")
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(templatesDir(t), "minimal"), filepath.Join(tdir, "minimal")).CombinedOutput(); err != nil {
		t.Fatalf("copying the minimal template: %v %s", err, out)
	}
	onBase := a.create(t, api.NewSandbox{TemplateID: "base"})
	if _, err := a.Client.CreateSnapshot(ctxT(t), onBase.ID(), "on-base"); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, filepath.Join(testutil.StateDir(t), "d"), "--templates-dir", tdir, "--database", dsn, "--secrets-key", key, "--registry", reg.URL)
	r = d.do(t, "POST", "/sandboxes", d.Key, strings.NewReader(`{"templateID":"on-base","timeout":60}`), nil)
	if r.Status != http.StatusNotFound || !bytes.Contains(r.Body, []byte(`template \"base\"`)) {
		t.Fatalf("create from a snapshot of base on a node without base = %d %s; want 404 naming the template", r.Status, r.Body)
	}
	if complete, partial := layerDirs(d.DataDir); len(complete)+len(partial) > 0 {
		t.Fatalf("a node without the template pulled layers: %v %v", complete, partial)
	}

	if err := b.Client.DeleteSnapshot(ctxT(t), sn.SnapshotID); err != nil {
		t.Fatalf("DeleteSnapshot on b: %v", err)
	}
	if list, err := a.Client.ListSnapshots(ctxT(t), "", "moved"); err != nil || len(list) != 0 {
		t.Fatalf("ListSnapshots on a after b deleted it = %+v, %v", list, err)
	}
	if err := a.Client.DeleteSnapshot(ctxT(t), sn.SnapshotID); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("DeleteSnapshot on a of the deleted snapshot = %v, want not found", err)
	}
}

// TestGvisorSnapshotMemoryThroughRegistry takes a snapshot of a gvisor
// sandbox (its checkpoint image: memory and processes) on node A and
// starts a sandbox from it on node B, which pulls the image from the
// registry: the processes started on A (a counting loop and an HTTP
// server whose page only their memory holds) go on there.
func TestGvisorSnapshotMemoryThroughRegistry(t *testing.T) {
	testutil.RequireRunsc(t)
	requireTemplate(t, "base")
	dsn := pgtest.New(t).Database(t)
	key := clusterKey(t)
	reg := startRegistry(t)
	a := startDaemon(t, filepath.Join(testutil.StateDir(t), "a"), "--database", dsn, "--secrets-key", key, "--registry", reg.URL)
	b := startDaemon(t, filepath.Join(testutil.StateDir(t), "b"), "--database", dsn, "--secrets-key", key, "--registry", reg.URL)
	parent := a.create(t, api.NewSandbox{TemplateID: "base", Metadata: gvisorMeta})
	c0 := serveAndCount(t, a, parent)
	sn, err := a.Client.CreateSnapshot(ctxT(t), parent.ID(), "")
	if err != nil {
		t.Fatalf("CreateSnapshot of a gvisor sandbox on a: %v", err)
	}
	fromSnap := b.create(t, api.NewSandbox{TemplateID: sn.SnapshotID})
	goesOn(t, b, fromSnap, c0, "sandbox on b from a's gvisor snapshot")
	if complete, _ := gvisorLayerDirs(b.DataDir); len(complete) != 1 {
		t.Errorf("node b keeps gvisor layers %v, want the snapshot's image", complete)
	}
}

// TestServeSnapshotsFromBeforeTheRegistry restarts a node of a shared
// database with a registry: the snapshot it took before stays its own,
// listed, started from and deleted on it, its layer kept.
func TestServeSnapshotsFromBeforeTheRegistry(t *testing.T) {
	testutil.RequireRoot(t)
	dsn := pgtest.New(t).Database(t)
	key := clusterKey(t)
	reg := startRegistry(t)
	a := startDaemon(t, filepath.Join(testutil.StateDir(t), "a"), "--database", dsn, "--secrets-key", key)
	src, err := a.Client.Create(ctxT(t), api.NewSandbox{TemplateID: "minimal"}) // killed before the restart
	if err != nil {
		t.Fatal(err)
	}
	sh(t, src.Envd(), `echo "taken without a registry" > /home/user/old`)
	sn, err := a.Client.CreateSnapshot(ctxT(t), src.ID(), "old")
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Kill(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	a.Stop()
	a.extra = append(a.extra, "--registry", reg.URL)
	a.Restart()
	if list, err := a.Client.ListSnapshots(ctxT(t), "", ""); err != nil || len(list) != 1 || list[0].SnapshotID != sn.SnapshotID {
		t.Fatalf("ListSnapshots after the restart with a registry = %+v, %v; want %s", list, err, sn.SnapshotID)
	}
	again := a.create(t, api.NewSandbox{TemplateID: "old"})
	if got := sh(t, again.Envd(), `cat /home/user/old`); got != "taken without a registry\n" {
		t.Fatalf("sandbox from the snapshot taken before the registry sees %q", got)
	}
	if err := a.Client.DeleteSnapshot(ctxT(t), sn.SnapshotID); err != nil {
		t.Fatalf("DeleteSnapshot of the node's own snapshot: %v", err)
	}
}
