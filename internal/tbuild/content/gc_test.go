package content

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// A collection keeps the trees named by a record, a pin, a lease while
// creates are in flight and a tombstone a live sandbox names; it removes
// every other tree and the cache entries naming them.
func TestCollectKeepsWhatIsUsed(t *testing.T) {
	st, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mk := func(name string) {
		t.Helper()
		tmp, err := st.TempDir()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Place(tmp, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"recorded", "pinned", "leased", "buried-live", "buried-gone", "unused"} {
		mk(n)
	}
	if err := st.Keep("k-unused", Entry{Tree: "unused", Ctx: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := st.Keep("k-recorded", Entry{Tree: "recorded", Ctx: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	st.Pin("build-1", "pinned")
	st.Lease("leased")
	for _, tomb := range []Tombstone{{ID: "live", Alias: "a", Trees: []string{"buried-live"}}, {ID: "gone", Alias: "b", Trees: []string{"buried-gone"}}} {
		if err := st.Bury(tomb); err != nil {
			t.Fatal(err)
		}
	}
	st.Collect(Collection{Records: []string{"recorded"}, InFlight: true, Live: func(t Tombstone) bool { return t.ID == "live" }})
	st.Close()
	ents, _ := os.ReadDir(filepath.Join(st.dir, "trees"))
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if want := []string{"buried-live", "leased", "pinned", "recorded"}; !slices.Equal(got, want) {
		t.Errorf("trees after the collection = %v, want %v", got, want)
	}
	if _, ok := st.Cached("build-2", "k-unused"); ok {
		t.Error("the cache entry of a collected tree is still there")
	}
	if e, ok := st.Cached("build-2", "k-recorded"); !ok || e.Tree != "recorded" {
		t.Errorf("the cache entry of a kept tree = %v, %v", e, ok)
	}
	if ts := st.readTombstones(); len(ts) != 1 || ts[0].ID != "live" {
		t.Errorf("tombstones after the collection = %v, want only the live one", ts)
	}

	// Unpinned, with no create in flight and nothing naming them, the
	// pinned and leased trees go; a lease alone does not keep a tree once
	// creates are done.
	st.Unpin("build-1")
	st.Unpin("build-2")
	st.Collect(Collection{Records: []string{"recorded"}, InFlight: false, Live: func(Tombstone) bool { return false }})
	st.Close()
	ents, _ = os.ReadDir(filepath.Join(st.dir, "trees"))
	if len(ents) != 1 || ents[0].Name() != "recorded" {
		t.Errorf("trees after the second collection = %v, want [recorded]", ents)
	}
}

// Without a list of live sandboxes (Live nil) every tombstone is kept,
// and a lease older than leaseTime keeps nothing.
func TestCollectWithoutSandboxes(t *testing.T) {
	now := time.Unix(1e9, 0)
	st, err := Open(Options{Dir: t.TempDir(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, n := range []string{"buried", "leased"} {
		tmp, _ := st.TempDir()
		if err := st.Place(tmp, n); err != nil {
			t.Fatal(err)
		}
	}
	st.Lease("leased")
	now = now.Add(leaseTime + time.Second)
	if err := st.Bury(Tombstone{ID: "x", Alias: "x", Trees: []string{"buried"}}); err != nil {
		t.Fatal(err)
	}
	st.Collect(Collection{InFlight: true})
	st.Close()
	if _, err := os.Stat(st.TreePath("buried")); err != nil {
		t.Errorf("a tombstone's tree went without a list of sandboxes: %v", err)
	}
	if _, err := os.Stat(st.TreePath("leased")); err == nil {
		t.Error("an expired lease kept its tree")
	}
}
