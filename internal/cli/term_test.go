package cli

import (
	"os"
	"testing"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/client"
)

func TestRawModeAndSize(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty on this machine: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	fd := int(tty.Fd())
	if !isTerminal(fd) || terminalFd(tty) != fd {
		t.Fatalf("isTerminal(pty) = false, want true")
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isTerminal(int(r.Fd())) || terminalFd(r) != -1 {
		t.Errorf("isTerminal(pipe) = true, want false")
	}
	if err := pty.Setsize(tty, &pty.Winsize{Cols: 132, Rows: 43}); err != nil {
		t.Fatal(err)
	}
	if got, err := termSize(fd); err != nil || got != (client.PTYSize{Cols: 132, Rows: 43}) {
		t.Errorf("termSize = %+v, %v; want 132x43", got, err)
	}
	old, err := makeRaw(fd)
	if err != nil {
		t.Fatalf("makeRaw = %v", err)
	}
	raw, _ := unix.IoctlGetTermios(fd, unix.TCGETS)
	if raw.Lflag&(unix.ICANON|unix.ECHO|unix.ISIG) != 0 || raw.Oflag&unix.OPOST != 0 {
		t.Errorf("after makeRaw lflag %#x oflag %#x, want ICANON, ECHO, ISIG and OPOST off", raw.Lflag, raw.Oflag)
	}
	if err := old.restore(); err != nil {
		t.Fatalf("restore = %v", err)
	}
	back, _ := unix.IoctlGetTermios(fd, unix.TCGETS)
	if *back != old.t {
		t.Errorf("after restore termios = %+v, want %+v", *back, old.t)
	}
}
