package quota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/testutil"
)

// setAfterGetFree sets the hook between the kernel's answer and the bind
// for the test's duration.
func setAfterGetFree(t *testing.T, f func(n int)) {
	t.Helper()
	afterGetFree = f
	t.Cleanup(func() { afterGetFree = nil })
}

// TestLoopTakenByOthersIsUnavailable: when another process binds each free
// loop device between the kernel naming it and fence's bind (here the test
// binds it, through its own descriptor, as another process would), NewDir
// fails as unavailable (a busy host: the API's 503, try again), not as a
// fault of fence's, and leaves nothing behind.
func TestLoopTakenByOthersIsUnavailable(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	scratch := filepath.Join(t.TempDir(), "scratch.img")
	if err := os.WriteFile(scratch, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	img, err := os.OpenFile(scratch, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	var taken []*os.File
	t.Cleanup(func() {
		for _, l := range taken {
			l.Close() // autoclear: the device detaches
		}
	})
	setAfterGetFree(t, func(n int) {
		l, err := openLoop(fmt.Sprintf("/dev/loop%d", n), n)
		if err != nil {
			t.Errorf("the other process's open of loop%d: %v", n, err)
			return
		}
		taken = append(taken, l)
		// EBUSY: a real other process bound it first, as well.
		if err := configureLoop(l, img, scratch); err != nil && !errors.Is(err, unix.EBUSY) {
			t.Errorf("the other process's bind of loop%d: %v", n, err)
		}
	})
	_, err = f.NewDir(t.Context(), "a", MinLimit)
	if !errors.Is(err, api.ErrUnavailable) || !errors.Is(err, unix.EBUSY) {
		t.Fatalf("NewDir with every free device taken by another process = %v, want EBUSY wrapping api.ErrUnavailable", err)
	}
	if len(taken) != loopTries {
		t.Errorf("%d devices tried, want %d", len(taken), loopTries)
	}
	// The seed image of the size (kept for the next NewDir) aside.
	for _, d := range []string{f.imageDir, f.mountDir} {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), seedPrefix) {
				t.Errorf("%s holds %s after the failed NewDir, want nothing", d, e.Name())
			}
		}
	}
}

// TestLoopAttachesOfOneProcessDoNotRace: this process's attaches never
// stand two at once between the kernel naming a free device and the bind,
// where both would be named the same device and one would fail and ask
// again (as a daemon's concurrent creates did until one lost every try).
// The hook holds each attach there a moment, for the others to come.
func TestLoopAttachesOfOneProcessDoNotRace(t *testing.T) {
	testutil.RequireRoot(t)
	f := openTest(t)
	var mu sync.Mutex
	in, most := 0, 0
	setAfterGetFree(t, func(int) {
		mu.Lock()
		in++
		most = max(most, in)
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		in--
		mu.Unlock()
	})
	var wg sync.WaitGroup
	for i := range 6 {
		name := fmt.Sprintf("d%d", i)
		wg.Go(func() {
			if _, err := f.NewDir(t.Context(), name, MinLimit); err != nil {
				t.Errorf("NewDir(%s) = %v", name, err)
				return
			}
			t.Cleanup(func() { f.RemoveDir(name) })
		})
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("%d attaches at once between the kernel's answer and the bind, want 1", most)
	}
}
