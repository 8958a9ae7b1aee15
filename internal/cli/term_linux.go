package cli

import (
	"golang.org/x/sys/unix"

	"github.com/fencesandbox/fence/client"
)

// termState is a terminal's settings, saved to be restored.
type termState struct {
	fd int
	t  unix.Termios
}

// isTerminal reports whether fd is a terminal.
func isTerminal(fd int) bool {
	_, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	return err == nil
}

// makeRaw puts the terminal fd into raw mode (as cfmakeraw(3) does) and
// returns its previous state.
func makeRaw(fd int) (*termState, error) {
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	old := &termState{fd: fd, t: *t}
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN] = 1
	t.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, t); err != nil {
		return nil, err
	}
	return old, nil
}

// restore puts the terminal back in its saved state.
func (s *termState) restore() error {
	return unix.IoctlSetTermios(s.fd, unix.TCSETS, &s.t)
}

// termSize returns the size of the terminal fd.
func termSize(fd int) (client.PTYSize, error) {
	ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
	if err != nil {
		return client.PTYSize{}, err
	}
	return client.PTYSize{Cols: ws.Col, Rows: ws.Row}, nil
}
