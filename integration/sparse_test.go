package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// A file with holes costs a sandbox nothing (`truncate -s 16T`), and
// costs the daemon what it holds, not its apparent size: a diff of a
// sandbox with two 16 TiB files (16 TiB less a block where the writable
// layer is ext4) answers within the test's minute, hashes them apart (the
// same data at other offsets), a checkpoint of them is charged a few
// blocks, and the checkpoint's copy hashes as the files it copied.
func TestDiffSparseFile(t *testing.T) { forLayerStores(t, testDiffSparseFile) }

func testDiffSparseFile(t *testing.T, flags ...string) {
	d := startDaemon(t, newDataDir(t), flags...)
	ctx := ctxT(t)
	sb := d.create(t, api.NewSandbox{})
	e := sb.Envd()
	out := rsh(t, e, `set -e
		for f in /big /moved; do
			truncate -s 16T $f 2>/dev/null || truncate -s $((16*1024*1024*1024*1024-4096)) $f
		done
		printf data | dd of=/big bs=1 seek=$((1<<30)) conv=notrunc 2>/dev/null
		printf data | dd of=/moved bs=1 seek=$((2<<30)) conv=notrunc 2>/dev/null
		stat -c %s /big`)
	size, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || size < 15<<40 {
		t.Fatalf("the sparse file's size: %q", out)
	}
	t0 := time.Now()
	diff, err := d.Client.Diff(ctx, sb.ID(), "", "")
	t.Logf("diff of a sandbox with two %d-byte sparse files: %v", size, time.Since(t0))
	if err != nil {
		t.Fatalf("Diff: %v", err)
	}
	got := map[string]api.FileDiff{}
	for _, f := range diff {
		got[f.Path] = f
	}
	big, moved := got["/big"], got["/moved"]
	if big.Change != "added" || big.Size != size || big.SHA256 == "" {
		t.Errorf("diff /big = %+v, want added, size %d, a hash", big, size)
	}
	if big.SHA256 == moved.SHA256 {
		t.Errorf("/big and /moved (the same data at other offsets) hash the same: %s", big.SHA256)
	}
	cp, err := d.Client.Checkpoint(ctx, sb.ID(), "sparse")
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if cp.Bytes > 16<<20 {
		t.Errorf("the checkpoint is charged %d bytes for a few blocks of data", cp.Bytes)
	}
	since, err := d.Client.Diff(ctx, sb.ID(), "sparse", "")
	if err != nil {
		t.Fatalf("Diff from the checkpoint: %v", err)
	}
	for _, f := range since {
		if f.Path == "/big" || f.Path == "/moved" {
			t.Errorf("the checkpoint's copy hashes otherwise than the file: %+v", f)
		}
	}
}
