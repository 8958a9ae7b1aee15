package httpapi

import (
	"io"
	"net/http"
	"time"
)

// idleBody is a request body whose every Read must make progress within
// idle: before each Read the connection's read deadline moves to now+idle,
// and once the body ends (EOF) it is cleared, so that the server's watch
// for a client hang-up, which reads the same connection during a long
// response stream, is never cut by it. After an error the deadline stays:
// the server's own read of what is left of the body then fails too, and it
// closes the connection.
type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	done bool // the body ended or failed, or the connection has no deadlines
}

func (b *idleBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	if err := b.rc.SetReadDeadline(time.Now().Add(b.idle)); err != nil {
		b.done = true // not supported by this connection
		return b.ReadCloser.Read(p)
	}
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done = true
		if err == io.EOF {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	}
	return n, err
}
