package process

import (
	"context"
	"net/http"
)

// A Start stream ends with three writes to the connection if each is
// flushed on its own: the end event, the end-of-stream message, the
// response's last chunk. The end event is flushed with the other two
// instead, when the handler returns right after it: one write, and a
// client that reads the end event finds the end of the response with it
// (and can reuse the connection) rather than waiting for two more
// segments.

// flushGate is a response writer whose flushes can be held back until the
// handler returns (net/http then writes what is buffered and the last
// chunk at once).
type flushGate struct {
	http.ResponseWriter
	held bool
}

func (g *flushGate) Flush() {
	if g.held {
		return
	}
	if f, ok := g.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (g *flushGate) Unwrap() http.ResponseWriter { return g.ResponseWriter }

type flushGateKey struct{}

// withFlushGate serves h with a flushGate in each request's context.
func withFlushGate(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := &flushGate{ResponseWriter: w}
		h.ServeHTTP(g, r.WithContext(context.WithValue(r.Context(), flushGateKey{}, g)))
	})
}

// holdFlushes makes the stream of ctx flush nothing more: what is written
// goes out when its handler returns. Only for the last message of a
// stream whose handler returns right after sending it.
func holdFlushes(ctx context.Context) {
	if g, ok := ctx.Value(flushGateKey{}).(*flushGate); ok {
		g.held = true
	}
}
