package users

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestLookupReadsPasswdOnce: a lookup that the cache does not answer
// opens /etc/passwd once (its account and login shell from one read) and
// /etc/group once, counted by inotify. (A process elsewhere on the machine
// opening either file at the same moment would be counted too.)
func TestLookupReadsPasswdOnce(t *testing.T) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	wds := map[int32]string{}
	for _, f := range accountFiles {
		wd, err := unix.InotifyAddWatch(fd, f, unix.IN_OPEN)
		if err != nil {
			t.Skipf("watching %s: %v", f, err)
		}
		wds[int32(wd)] = f
	}
	u, err := lookup("root")
	if err != nil || u.UID != 0 || u.Shell == "" {
		t.Fatalf("lookup(root) = %+v, %v", u, err)
	}
	opens := map[string]int{}
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n <= 0 {
			break
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			opens[wds[ev.Wd]]++
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
	if opens["/etc/passwd"] != 1 || opens["/etc/group"] != 1 {
		t.Errorf("a lookup opened /etc/passwd %d times and /etc/group %d times, want once each", opens["/etc/passwd"], opens["/etc/group"])
	}
}

// TestPasswdEntry: the line found is the one os/user finds.
func TestPasswdEntry(t *testing.T) {
	b := []byte("# alice:x:1:1::/c:/bin/c\n+alice:x:2:2::/n:/bin/n\nalice:x:x:3::/u:/bin/u\nalicex:x:4:4::/p:/bin/p\n" +
		"alice:x:5:6\n  alice:x:1001:1002:Alice,,,:/home/alice:/bin/zsh  \nalice:x:7:7::/l:/bin/l\nbob:x:8:8::/b\n")
	f, ok := passwdEntry(b, "alice")
	if !ok || f[2] != "1001" || f[3] != "1002" || f[5] != "/home/alice" || f[6] != "/bin/zsh" {
		t.Errorf("alice: %q, %v", f, ok)
	}
	if f, ok := passwdEntry(b, "bob"); ok {
		t.Errorf("bob, a line of five colons, found: %q", f)
	}
	if _, ok := passwdEntry(b, "carol"); ok {
		t.Error("carol found")
	}
}
