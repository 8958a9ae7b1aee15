package native_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/native"
)

// changesOf lists ch as "path kind mode sha target opaque" lines.
func changesOf(ch []isolation.FileChange) []string {
	var out []string
	for _, c := range ch {
		out = append(out, fmt.Sprintf("%s %s %o %s %s %v", c.Path, c.Kind, c.Mode, c.SHA256, c.Target, c.Opaque))
	}
	return out
}

// stateScript prints what a sandbox's files are, for comparisons.
const stateScript = `cd / && for p in /home/app /d /keep /usr/share /bin/ls /gone /t; do
	find $p -exec stat -c '%n %F %a %u %g %s' {} + 2>/dev/null | sort; done
	find /home/app /d /usr/share /t -type f -exec md5sum {} + 2>/dev/null | sort; true`

// A checkpoint after the first stacks on it and holds only what changed
// since: nothing when nothing did. A sandbox booted on it sees exactly what
// the source had then (files rewritten, removed, moved, made anew; a
// directory removed and made again, over the template's or not; modes and
// owners changed), one booted on an earlier checkpoint what the source had
// at that one, and the layer's changes are the source's.
func TestCheckpointStack(t *testing.T) {
	b := newBackendWith(t, native.Options{CopyLayers: true})
	src := create(t, b, isolation.Spec{})
	cp := src.(isolation.Checkpointer)
	sh(t, src, `set -e
		mkdir -p /home/app/sub /d/e /keep
		echo a > /home/app/a; echo b > /home/app/b; echo x > /d/x; echo y > /d/e/y; echo k > /keep/k
		ln -s a /home/app/link; mkfifo /home/app/fifo
		rm -f /bin/ls; sleep 0.2`)
	first, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	same, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if same.Parent != first.ID || same.Files != 0 {
		t.Errorf("checkpoint with nothing changed: parent %q, %d entries; want %q, 0", same.Parent, same.Files, first.ID)
	}
	if ents, _ := os.ReadDir(filepath.Join(b.LayersDir(), same.ID, "tree")); len(ents) != 0 {
		t.Logf("%v", ents)
		t.Errorf("checkpoint with nothing changed holds %d entries", len(ents))
	}

	atFirst := sh(t, src, stateScript)
	sh(t, src, `set -e
		echo A > /home/app/a; rm /home/app/b; mv /home/app/link /home/app/link2
		rm -rf /d; mkdir -p /d/e; echo z > /d/z
		chmod 700 /keep; chown 1000:1000 /keep/k
		rm -rf /usr/share; mkdir /usr/share; echo only > /usr/share/only
		echo t > /gone; mkdir /t; echo t > /t/f; sleep 0.2`)
	third, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if third.Parent != same.ID {
		t.Errorf("third checkpoint's parent %q, want %q", third.Parent, same.ID)
	}
	atThird := sh(t, src, stateScript)
	srcChanges, err := cp.Changes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sh(t, src, `rm -rf /gone /t; echo later > /home/app/a`)
	fourth, err := cp.Checkpoint(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	atFourth := sh(t, src, stateScript)

	for _, c := range []struct {
		layer, want string
	}{{first.ID, atFirst}, {same.ID, atFirst}, {third.ID, atThird}, {fourth.ID, atFourth}} {
		g := createOn(t, b, c.layer)
		if got := sh(t, g, stateScript); got != c.want {
			t.Errorf("sandbox on %s sees\n%s\nwant\n%s", c.layer, got, c.want)
		}
	}
	layerChanges, err := b.LayerChanges(t.Context(), third.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := changesOf(layerChanges), changesOf(srcChanges); !slices.Equal(got, want) {
		t.Errorf("changes of the stacked layer\n%s\nthe source's then\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if held := src.(isolation.LayerHolder).HeldLayers(); !slices.Contains(held, fourth.ID) {
		t.Errorf("the sandbox holds %v, not its last checkpoint %s", held, fourth.ID)
	}
}

// A deep stack of checkpoints is squashed in the background into one
// layer on the sandbox's boot layer, which the next checkpoint stacks on:
// the stack stays bounded, and sandboxes booted on every checkpoint, deep
// ones and those after the squash, see what the source had.
func TestCheckpointSquash(t *testing.T) {
	b := newBackendWith(t, native.Options{CopyLayers: true})
	src := create(t, b, isolation.Spec{})
	cp := src.(isolation.Checkpointer)
	sh(t, src, `mkdir -p /home/app/d && echo base > /home/app/keep && rm -f /bin/ls && sleep 0.1`)
	ids := map[string]bool{}
	var deepest isolation.LayerInfo
	var states []string
	var layers []string
	squashed := ""
	for i := 0; i < 40 && squashed == ""; i++ {
		sh(t, src, fmt.Sprintf(`echo %d > /home/app/n; rm -f /home/app/d/%d; echo x > /home/app/d/%d; sleep 0.1`, i, i-1, i))
		info, err := cp.Checkpoint(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.Depth > deepest.Depth {
			deepest = info
		}
		if info.Parent != "" && !ids[info.Parent] {
			squashed = info.Parent
		}
		ids[info.ID] = true
		layers = append(layers, info.ID)
		states = append(states, sh(t, src, stateScript+`; cat /home/app/n; ls /home/app/d; test -e /bin/ls && echo ls; true`))
		time.Sleep(50 * time.Millisecond)
	}
	if squashed == "" {
		t.Fatalf("no checkpoint stacked on a squashed layer; the deepest at depth %d", deepest.Depth)
	}
	t.Logf("%d checkpoints, the deepest at depth %d, then stacked on the squashed layer %s", len(layers), deepest.Depth, squashed)
	if deepest.Depth > 10 {
		t.Errorf("the stack reached depth %d", deepest.Depth)
	}
	m, err := b.ListLayers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range m {
		if l.ID == squashed && (l.Parent != "" || l.Depth != 1) {
			t.Errorf("squashed layer: parent %q depth %d, want the template, 1", l.Parent, l.Depth)
		}
	}
	// The deepest, the squashed and the last one.
	check := func(layer, want string) {
		g := createOn(t, b, layer)
		if got := sh(t, g, stateScript+`; cat /home/app/n; ls /home/app/d; test -e /bin/ls && echo ls; true`); got != want {
			t.Errorf("sandbox on %s sees\n%s\nwant\n%s", layer, got, want)
		}
		g.Kill(t.Context())
	}
	for i, l := range layers {
		if l == deepest.ID || i == len(layers)-1 {
			check(l, states[i])
		}
	}
	// The squashed layer shows the checkpoint it squashed: the one before
	// the first stacked on it.
	for i, l := range layers {
		if i > 0 && l != "" && parentOf(t, b, l) == squashed {
			check(squashed, states[i-1])
			break
		}
	}
}

func parentOf(t *testing.T, b *native.Backend, id string) string {
	t.Helper()
	ls, err := b.ListLayers(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.ID == id {
			return l.Parent
		}
	}
	return ""
}

// Without squashes, a sandbox's checkpoints stack up to the deepest stack
// a sandbox may boot on, and the next one is a whole copy on the boot
// layer again; sandboxes booted on the deepest one and on that copy see
// what the source had.
func TestCheckpointStackCap(t *testing.T) {
	native.NoSquash(t)
	b := newBackendWith(t, native.Options{CopyLayers: true})
	src := create(t, b, isolation.Spec{})
	cp := src.(isolation.Checkpointer)
	var infos []isolation.LayerInfo
	for i := 0; i <= native.MaxLayerStack; i++ {
		sh(t, src, fmt.Sprintf(`echo %d > /home/n%d`, i, i%3))
		info, err := cp.Checkpoint(t.Context())
		if err != nil {
			t.Fatalf("checkpoint %d: %v", i+1, err)
		}
		infos = append(infos, info)
	}
	deepest, whole := infos[len(infos)-2], infos[len(infos)-1]
	if deepest.Depth != native.MaxLayerStack || whole.Parent != "" || whole.Depth != 1 {
		t.Fatalf("checkpoint %d at depth %d, the next on %q at depth %d; want %d, then a whole copy at depth 1",
			len(infos)-1, deepest.Depth, whole.Parent, whole.Depth, native.MaxLayerStack)
	}
	want := fmt.Sprintf("%d\n%d\n%d\n", native.MaxLayerStack-2, native.MaxLayerStack-1, native.MaxLayerStack-3)
	if got := sh(t, createOn(t, b, deepest.ID), `cat /home/n0 /home/n1 /home/n2`); got != want {
		t.Errorf("sandbox on the deepest checkpoint reads %q, want %q", got, want)
	}
	want = fmt.Sprintf("%d\n%d\n%d\n", native.MaxLayerStack-2, native.MaxLayerStack-1, native.MaxLayerStack)
	if got := sh(t, createOn(t, b, whole.ID), `cat /home/n0 /home/n1 /home/n2`); got != want {
		t.Errorf("sandbox on the whole copy reads %q, want %q", got, want)
	}
}
