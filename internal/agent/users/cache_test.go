package users

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// countingLoad looks name up in the test's passwd file and counts calls.
type countingLoad struct {
	passwd string
	calls  int
}

func (l *countingLoad) load(name string) (*User, error) {
	l.calls++
	b, err := os.ReadFile(l.passwd)
	if err != nil {
		return nil, err
	}
	var u User
	var pw string
	if _, err := fmt.Sscanf(string(b), "%s %s %d", &u.Name, &pw, &u.UID); err != nil {
		return nil, err
	}
	if u.Name != name {
		return nil, fmt.Errorf("looking up user %q: %w", name, ErrUnknownUser)
	}
	u.Groups = []uint32{u.UID}
	return &u, nil
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLookupCacheSeesEveryChange: a kept lookup is used only while
// neither account file has changed, however the change was made: in
// place with the same size and the old modification time put back, or by
// replacing the file. Files changed less than settleTime ago are not
// kept at all.
func TestLookupCacheSeesEveryChange(t *testing.T) {
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	writeFile(t, passwd, "alice x 1000\n")
	writeFile(t, group, "g\n")
	c := &lookupCache{files: [2]string{passwd, group}, now: time.Now}
	l := &countingLoad{passwd: passwd}
	get := func(name string, wantUID uint32, wantCalls int) {
		t.Helper()
		u, err := c.lookup(name, l.load)
		if err != nil {
			t.Fatalf("lookup(%q): %v", name, err)
		}
		if u.UID != wantUID {
			t.Fatalf("lookup(%q) uid = %d, want %d", name, u.UID, wantUID)
		}
		if l.calls != wantCalls {
			t.Fatalf("lookup(%q): %d loads, want %d", name, l.calls, wantCalls)
		}
	}
	// Just written: not settled, every lookup loads.
	get("alice", 1000, 1)
	get("alice", 1000, 2)

	time.Sleep(settleTime + 100*time.Millisecond)
	get("alice", 1000, 3)
	get("alice", 1000, 3) // kept
	u, _ := c.lookup("alice", l.load)
	u.Groups[0] = 0 // a caller's change does not reach the cache
	get("alice", 1000, 3)
	if u, _ := c.lookup("alice", l.load); u.Groups[0] != 1000 {
		t.Fatalf("cached groups changed by a caller: %v", u.Groups)
	}

	// Unknown names are kept too.
	if _, err := c.lookup("bob", l.load); !errors.Is(err, ErrUnknownUser) {
		t.Fatalf("lookup(bob) = %v, want ErrUnknownUser", err)
	}
	if _, err := c.lookup("bob", l.load); !errors.Is(err, ErrUnknownUser) || l.calls != 4 {
		t.Fatalf("lookup(bob) again = %v after %d loads, want ErrUnknownUser after 4", err, l.calls)
	}

	// In place, same size, old mtime put back: the change time differs.
	fi, err := os.Stat(passwd)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(passwd, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("alice x 1001\n"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(passwd, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	get("alice", 1001, 5)

	// The group file counts as much as passwd; a replaced file has another
	// inode.
	time.Sleep(settleTime + 100*time.Millisecond)
	get("alice", 1001, 6)
	get("alice", 1001, 6)
	writeFile(t, group+".new", "g\n")
	if err := os.Rename(group+".new", group); err != nil {
		t.Fatal(err)
	}
	get("alice", 1001, 7)

	// A missing account file: nothing is kept.
	os.Remove(group)
	get("alice", 1001, 8)
	get("alice", 1001, 9)
}

// TestLookupRoot checks the real lookup through the cache.
func TestLookupRoot(t *testing.T) {
	for range 2 {
		u, err := Lookup("root")
		if err != nil {
			t.Fatal(err)
		}
		if u.UID != 0 || u.Name != "root" || len(u.Groups) == 0 {
			t.Fatalf("Lookup(root) = %+v", u)
		}
	}
	if _, err := Lookup("no-such-user-fence"); !errors.Is(err, ErrUnknownUser) {
		t.Fatalf("Lookup(no-such-user-fence) = %v, want ErrUnknownUser", err)
	}
}
