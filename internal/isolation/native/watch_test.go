package native_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
	"github.com/fencesandbox/fence/internal/testutil"
)

// treeScript lists the sandbox's files as a checkpoint keeps them: each
// path with its type, mode, owner, size, mtime, user.* extended
// attributes, and its content's hash or its symlink's target (the link
// count left out: a checkpoint copies each name of a hard link; the
// mtimes of fifos, which a copy does not keep, and of the directories
// every create writes files into, left out too).
const treeScript = `python3 - <<'PY'
import hashlib, os, stat
fresh = {"/etc", "/usr", "/usr/bin"}
skip = {"/proc", "/sys", "/dev", "/tmp", "/run", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf"}
out = []
for top, dirs, files in os.walk("/", followlinks=False):
    dirs[:] = sorted(d for d in dirs if os.path.join(top, d) not in skip)
    for n in sorted(dirs + files):
        p = os.path.join(top, n)
        if p in skip:
            continue
        st = os.lstat(p)
        x = sorted((k, os.getxattr(p, k, follow_symlinks=False)) for k in os.listxattr(p, follow_symlinks=False) if k.startswith("user."))
        what = ""
        if stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(open(p, "rb").read()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            what = os.readlink(p)
        mt = st.st_mtime_ns
        if stat.S_ISLNK(st.st_mode) or stat.S_ISFIFO(st.st_mode) or p in fresh:
            mt = 0
        out.append(f"{p} {st.st_mode:o} {st.st_uid}:{st.st_gid} {st.st_size if not stat.S_ISDIR(st.st_mode) else 0} {mt} {x} {what}")
print("\n".join(out))
PY`

// A checkpoint made from the record of the sandbox's changes (watch.go)
// is what the sandbox's files are, and what a walk of its writable layer
// makes: after writes (one through a second name of a file), a truncate, a write through a shared mapping held
// across the checkpoint, chmod, chown, utimes, an extended attribute, a
// hard link, renames of a file and of a directory (and a write in the
// renamed directory), deletions (of a tree, of files, of template files),
// a template directory made anew (opaque), a new tree, a fifo and a
// symlink. Sandboxes booted on each list the same tree as the source.
func TestCheckpointWatched(t *testing.T) {
	b := newBackendWith(t, native.Options{CopyLayers: true})
	native.NoSquash(t)
	rootfs := testutil.RootFS(t, "base")
	src := create(t, b, isolation.Spec{RootFS: rootfs})
	sh(t, src, `set -e
		mkdir -p /w/d1/d2 /w/mv/sub /w/gone/x /w/same/deep
		i=0; while [ $i -lt 20 ]; do echo "$i" > /w/d1/f$i; i=$((i+1)); done
		echo a > /w/mv/sub/a; echo b > /w/gone/x/b; echo s > /w/same/deep/s
		ln /w/d1/f8 /w/same/link8
		echo keep > /w/t; echo x > /w/ren; head -c 8192 /dev/zero > /w/m
		cat > /w/mm.py <<'PY'
import mmap, os, time
fd = os.open("/w/m", os.O_RDWR)
m = mmap.mmap(fd, 8192)
os.close(fd)
m[0:1] = b"A"
m.flush()
open("/run/mm-ready", "w").close()
while not os.path.exists("/run/mm-go"):
    time.sleep(0.02)
m[1:2] = b"B"
open("/run/mm-done", "w").close()
time.sleep(3600)
PY
		setsid python3 /w/mm.py </dev/null >/dev/null 2>&1 &
		while [ ! -e /run/mm-ready ]; do sleep 0.02; done
		sleep 0.2 # every entry stable (stableMargin) at the first checkpoint`)
	cp := src.(isolation.Checkpointer)
	if _, err := cp.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	restore := native.KeepLastCheckpoint(src)
	sh(t, src, `set -e
		echo more >> /w/d1/f1
		truncate -s 1 /w/d1/f2
		chmod 600 /w/d1/f3
		chown 1000:1000 /w/d1/f4
		python3 -c 'import os; os.setxattr("/w/d1/f5", "user.k", b"v")'
		touch -d 2001-01-01 /w/t
		ln /w/d1/f6 /w/d1/hard
		echo through-the-other-name >> /w/same/link8
		mv /w/ren /w/ren2
		mv /w/mv /w/mv2 && echo c > /w/mv2/sub/c
		rm -r /w/gone && rm /w/d1/f7
		echo tmp > /w/same/deep/made-and-gone && rm /w/same/deep/made-and-gone
		rm /etc/debian_version
		rm -rf /etc/default && mkdir /etc/default && echo new > /etc/default/new
		mkdir -p /w/new/a/b && echo n > /w/new/a/b/n && ln -s ../../d1/f1 /w/new/a/sym
		mkfifo /w/fifo
		chmod 700 /w/d1/d2
		touch /run/mm-go; while [ ! -e /run/mm-done ]; do sleep 0.02; done`)
	want := sh(t, src, treeScript)
	if !strings.Contains(want, "/w/new/a/b/n") {
		t.Fatalf("the listing misses the new tree:\n%s", want)
	}
	watched, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n := native.WatchedCheckpoints(src); n != 1 {
		t.Fatalf("%d checkpoints made from the record of changes, want 1", n)
	}
	// Nothing changed: the checkpoint reads the file held mapped, and
	// neither the layer's other entries nor those indexed as not yet
	// stable the time before (none are after a second checkpoint).
	sh(t, src, `sleep 0.2`)
	if _, err := cp.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := native.ExaminedEntries(src); n > 2 {
		t.Errorf("a checkpoint with nothing changed read %d entries of the writable layer, want at most 2 (/w/m, held mapped, looked at and copied)", n)
	}
	restore()
	walked, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n := native.WatchedCheckpoints(src); n != 3 {
		t.Fatalf("%d checkpoints made from the record of changes after a lost record, want 3", n)
	}
	if watched.Parent != walked.Parent {
		t.Fatalf("the watched checkpoint stacks on %s, the walked one on %s", watched.Parent, walked.Parent)
	}
	for name, id := range map[string]string{"watched": watched.ID, "walked": walked.ID} {
		sb, err := b.CreateOn(t.Context(), isolation.Spec{RootFS: rootfs}, id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Kill(context.Background()) })
		if got := sh(t, sb, treeScript); got != want {
			t.Errorf("a sandbox booted on the %s checkpoint lists another tree:\n%s", name, diffLines(want, got))
		}
	}
	// The same changes, as a diff lists them.
	a, err := b.LayerChanges(t.Context(), watched.ID)
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.LayerChanges(t.Context(), walked.ID)
	if err != nil {
		t.Fatal(err)
	}
	if g, w := strings.Join(changesOf(a), "\n"), strings.Join(changesOf(c), "\n"); g != w {
		t.Errorf("the watched checkpoint's changes differ from the walk's:\n%s", diffLines(w, g))
	}
}

// diffLines lists the lines of want missing from got (-) and of got
// missing from want (+).
func diffLines(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var out []string
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// A record that outgrows its bound is dropped, and its fanotify group
// closed at once: the sandbox's later writes make no events for the
// daemon to read. The next checkpoint walks the writable layer (and holds
// every change), and the one after it is made from a new record.
func TestCheckpointWatchLost(t *testing.T) {
	b := newBackendWith(t, native.Options{CopyLayers: true})
	native.NoSquash(t)
	src := create(t, b, isolation.Spec{})
	cp := src.(isolation.Checkpointer)
	sh(t, src, `mkdir /w && sleep 0.1`)
	if _, err := cp.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	sh(t, src, `cd /w && seq 1 17000 | sed 's/^/f/' | xargs touch && sleep 0.1`)
	for end := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if _, open := native.WatchState(src); !open {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the watcher still holds its group a minute after its record outgrew its bound")
		}
	}
	read, _ := native.WatchState(src)
	sh(t, src, `cd /w && seq 1 500 | sed 's/^/g/' | xargs touch && sleep 0.3 && rm g*`)
	if again, _ := native.WatchState(src); again != read {
		t.Errorf("the lost record's watcher read %d events after its loss", again-read)
	}
	walked, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n := native.WatchedCheckpoints(src); n != 0 {
		t.Fatalf("a checkpoint after 17,000 names changed was made from the record (%d)", n)
	}
	if n := native.ExaminedEntries(src); n < 17000 {
		t.Fatalf("the walk read %d entries, want at least 17,000", n)
	}
	sh(t, src, `echo x > /w/f1 && sleep 0.1`)
	again, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n := native.WatchedCheckpoints(src); n != 1 {
		t.Fatalf("the checkpoint after the walk was not made from a new record (%d)", n)
	}
	for id, want := range map[string]string{walked.ID: "17000 0", again.ID: "17000 2"} {
		sb := createOn(t, b, id)
		if got := strings.TrimSpace(sh(t, sb, `echo $(ls /w | wc -l) $(wc -c < /w/f1)`)); got != want {
			t.Errorf("a sandbox booted on %s counts %q files and bytes of /w/f1, want %q", id, got, want)
		}
	}
}

// A checkpoint from the record finds the files the sandbox's processes
// hold mapped by their inode, wherever the index by inode learnt their
// names since the first checkpoint's walk: a rename, a file made since
// (and its second name), a tree made since, a name deleted and made
// again. Each
// is written through a shared mapping (no event) after a checkpoint; the
// next one, from the record, holds the writes, and looks at a few keys of
// the index, not at the layer's thousands of files.
func TestCheckpointWatchedHeld(t *testing.T) {
	b := newBackendWith(t, native.Options{CopyLayers: true})
	native.NoSquash(t)
	rootfs := testutil.RootFS(t, "base")
	src := create(t, b, isolation.Spec{RootFS: rootfs})
	sh(t, src, `set -e
		mkdir -p /w/many && cd /w/many && seq 1 3000 | sed 's/^/f/' | xargs touch
		head -c 8192 /dev/zero > /w/a; head -c 8192 /dev/zero > /w/r
		cat > /w/mm.py <<'PY'
import mmap, os, sys, time
p, tag = sys.argv[1], sys.argv[2]
fd = os.open(p, os.O_RDWR)
m = mmap.mmap(fd, 8192)
os.close(fd)
m[0:1] = b"1"
open("/run/ready-" + tag, "w").close()
while not os.path.exists("/run/go"):
    time.sleep(0.02)
m[1:2] = b"2"
m.flush()
open("/run/done-" + tag, "w").close()
time.sleep(3600)
PY
		sleep 0.2`)
	cp := src.(isolation.Checkpointer)
	checkpoint := func() isolation.LayerInfo {
		t.Helper()
		info, err := cp.Checkpoint(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := native.InodeIndexOK(src); err != nil {
			t.Fatal(err)
		}
		return info
	}
	checkpoint()
	sh(t, src, `set -e
		mv /w/a /w/a2
		head -c 8192 /dev/zero > /w/b && ln /w/b /w/b-link
		mkdir -p /w/d/e && head -c 8192 /dev/zero > /w/d/e/c
		rm /w/r && head -c 8192 /dev/zero > /w/r
		sleep 0.2`)
	checkpoint()
	sh(t, src, `set -e
		for f in a2:a b-link:b d/e/c:c r:r; do
			setsid python3 /w/mm.py /w/${f%%:*} ${f#*:} </dev/null >/dev/null 2>&1 &
		done
		for tag in a b c r; do while [ ! -e /run/ready-$tag ]; do sleep 0.02; done; done
		sleep 0.2`)
	checkpoint()
	sh(t, src, `touch /run/go; for tag in a b c r; do while [ ! -e /run/done-$tag ]; do sleep 0.02; done; done`)
	want := sh(t, src, treeScript)
	last := checkpoint()
	if n := native.WatchedCheckpoints(src); n != 3 {
		t.Fatalf("%d checkpoints made from the record of changes, want 3", n)
	}
	t.Logf("the checkpoint looked at %d keys of the index by inode and read %d entries", native.LookedKeys(src), native.ExaminedEntries(src))
	// The 4 files held, /w/b beside /w/b-link, and what the kernel's
	// own inode numbers of other files may match.
	if n := native.LookedKeys(src); n > 16 {
		t.Errorf("the checkpoint looked at %d keys of the index by inode, want at most 16", n)
	}
	if n := native.ExaminedEntries(src); n > 32 {
		t.Errorf("the checkpoint read %d entries of the writable layer, want at most 32", n)
	}
	sb, err := b.CreateOn(t.Context(), isolation.Spec{RootFS: rootfs}, last.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Kill(context.Background()) })
	if got := sh(t, sb, treeScript); got != want {
		t.Errorf("a sandbox booted on the checkpoint lists another tree:\n%s", diffLines(want, got))
	}
}
