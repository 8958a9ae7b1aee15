package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	. "github.com/fencesandbox/fence/internal/oci/ocitest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// busyboxImage is a two-layer image: the host's static busybox with its
// applets, then a layer that whites out a file, makes a directory opaque,
// hard-links a file of the first layer and adds a set-uid file.
func busyboxImage(t *testing.T) v1.Image {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("reading the host's busybox (apt-get install busybox-static): %v", err)
	}
	home := Dir("home/user/", 0o755)
	home.Hdr.Uid, home.Hdr.Gid = 1000, 1000
	base := []Entry{
		Dir("bin/", 0o755), File("bin/busybox", 0o755, string(bb)),
		Dir("etc/", 0o755),
		File("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"),
		File("etc/group", 0o644, "root:x:0:\nuser:x:1000:\n"),
		Dir("home/", 0o755), home,
		File("etc/secret", 0o644, "lower\n"),
		Dir("etc/opq/", 0o755), File("etc/opq/a", 0o644, "a\n"), File("etc/opq/b", 0o644, "b\n"),
		File("etc/shared", 0o644, "shared\n"),
	}
	for _, applet := range []string{"sh", "cat", "ls", "test", "stat", "echo", "id", "pwd", "env"} {
		base = append(base, Symlink("bin/"+applet, "busybox"))
	}
	top := Layer(t,
		Dir("etc/", 0o755), File("etc/.wh.secret", 0o644, ""),
		Dir("etc/opq/", 0o755), File("etc/opq/.wh..wh..opq", 0o644, ""), File("etc/opq/c", 0o644, "c\n"),
		Link("etc/linked", "etc/shared"),
		File("bin/suid", 0o4755, "#!/bin/sh\necho suid\n"),
		Dir("work/", 0o777),
	)
	return Image(t, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/work"}, Layer(t, base...), top)
}

const imageCheck = `cat /etc/opq/c; ls /etc/opq | tr '\n' ' '; echo; test -e /etc/secret && echo SECRET-VISIBLE; ` +
	`cat /etc/linked; stat -c 'suid-mode=%a' /bin/suid; test -u /bin/suid && echo SUID-KEPT; echo done`

// TestTemplateFromImage builds templates with `fence template build
// --from-image` from an in-process registry and `--from-archive` from a
// docker-save tarball, then runs a command in a sandbox of each: it sees
// the image's files with the layers applied (whiteout, opaque directory,
// hard link) and no set-uid bit. A hostile image fails the build with a
// clear error and leaves no template. Root: the build chowns, and fence
// run creates the sandbox.
func TestTemplateFromImage(t *testing.T) {
	testutil.RequireRoot(t)
	reg := NewRegistry(t)
	img := busyboxImage(t)
	ref := reg.Push(t, "fence/busybox:1", img)
	state := testutil.StateDir(t)
	tdir, dataDir := filepath.Join(state, "templates"), filepath.Join(state, "data")

	out, errs, code := runFence(t, nil, nil, "template", "build", "bb", "--from-image", ref, "--templates-dir", tdir, "--data-dir", dataDir)
	t.Logf("template build: exit %d\n%s%s", code, out, errs)
	if code != 0 || !strings.Contains(errs, "layer 2/2") {
		t.Fatalf("fence template build --from-image = %d, %q; want success with layer progress", code, errs)
	}

	tarPath := filepath.Join(state, "saved.tar")
	tag, _ := name.NewTag("example.com/fence/busybox:1")
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		t.Fatal(err)
	}
	out, errs, code = runFence(t, nil, nil, "template", "build", "bb-saved", "--from-archive", tarPath, "--templates-dir", tdir, "--data-dir", dataDir)
	t.Logf("template build --from-archive: exit %d\n%s%s", code, out, errs)
	if code != 0 || !strings.Contains(errs, "cached") {
		t.Fatalf("fence template build --from-archive = %d, %q; want success from the cached layers", code, errs)
	}

	for _, tmpl := range []string{"bb", "bb-saved"} {
		out, errs, code = runFence(t, nil, nil, "run", "--data-dir", dataDir, "--templates-dir", tdir, "--template", tmpl, "--", "sh", "-c", imageCheck)
		t.Logf("fence run (%s): exit %d, stdout %q, stderr %q", tmpl, code, out, errs)
		want := "c\nc \nshared\nsuid-mode=755\ndone\n"
		if code != 0 || out != want {
			t.Errorf("in a sandbox of %s: exit %d, output %q; want %q", tmpl, code, out, want)
		}
	}

	bad := reg.Push(t, "fence/bad:1", Image(t, v1.Config{}, Layer(t, File("ok", 0o644, "ok")), Layer(t, Link("stolen", "../../../../etc/shadow"))))
	out, errs, code = runFence(t, nil, nil, "template", "build", "bad", "--from-image", bad, "--templates-dir", tdir, "--data-dir", dataDir)
	t.Logf("template build (hostile): exit %d\n%s%s", code, out, errs)
	if code == 0 || !strings.Contains(errs, "climbs out") {
		t.Errorf("fence template build of a hostile image = %d, %q; want a failure naming the entry", code, errs)
	}
	entries, _ := os.ReadDir(tdir)
	for _, e := range entries {
		if e.Name() == "bad" || strings.HasPrefix(e.Name(), ".build-") {
			t.Errorf("the failed build left %s", e.Name())
		}
	}
}

// baseFirstCommands are what a user of E2B's base image types first.
const baseFirstCommands = `python -m http.server 8000 >/dev/null 2>&1 &
for i in $(seq 100); do code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/) && break; sleep 0.1; done
echo "http.server $code"
python -c 'print(6*7)'
pip --version | cut -d' ' -f1
node -e 'console.log(7*6)'
npm --version >/dev/null && echo npm
git --version | cut -d' ' -f1,2
sudo -n true && echo sudo
kill $! 2>/dev/null || true`

// TestBaseFirstCommands runs, in a sandbox of base, the commands a new
// user of E2B's base image types first: python (not only python3) serving
// http.server, pip, node, npm, git, curl and sudo. Root: fence run creates
// the sandbox.
func TestBaseFirstCommands(t *testing.T) {
	testutil.RequireRoot(t)
	rootfs := testutil.RootFS(t, "base")
	tdir := filepath.Dir(filepath.Dir(rootfs))
	dataDir := filepath.Join(testutil.StateDir(t), "data")
	out, errs, code := runFence(t, nil, nil, "run", "--data-dir", dataDir, "--templates-dir", tdir, "--template", "base", "--", "bash", "-c", baseFirstCommands)
	t.Logf("fence run: exit %d, stdout %q, stderr %q", code, out, errs)
	want := "http.server 200\n42\npip\n42\nnpm\ngit version\nsudo\n"
	if code != 0 || out != want {
		t.Errorf("base's first commands: exit %d, output %q; want %q", code, out, want)
	}
}
