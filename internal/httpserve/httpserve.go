// Package httpserve runs the HTTP servers of fence's roles (the daemon's
// API and the router) with the same settings: bounded header reads and
// sizes, idle keep-alives closed, the server's own errors in the log, and
// TLS (HTTP/2 and HTTP/1.1 by ALPN) when a certificate is given.
package httpserve

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Options configure a server.
type Options struct {
	Handler http.Handler
	// Logger receives the server's own errors, as warnings.
	Logger *slog.Logger
	// HeaderTimeout bounds reading a request's headers.
	HeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that waits this long for
	// its next request.
	IdleTimeout time.Duration
	// TLSCert and TLSKey are PEM files; an empty TLSCert serves plain HTTP.
	TLSCert, TLSKey string
}

// New returns a server for o. It sets no ReadTimeout or WriteTimeout: they
// would cut uploads and streams. A certificate is loaded now, so a bad one
// fails the start, not the first connection.
func New(o Options) (*http.Server, error) {
	srv := &http.Server{
		Handler:           o.Handler,
		ReadHeaderTimeout: o.HeaderTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(o.Logger.Handler(), slog.LevelWarn),
	}
	if o.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("loading TLS certificate: %w", err)
		}
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	return srv, nil
}

// Scheme is "https" for a server with TLS, else "http".
func Scheme(srv *http.Server) string {
	if srv.TLSConfig != nil {
		return "https"
	}
	return "http"
}

// Serve serves srv on ln until ctx is done, then returns nil with the
// server still running (the caller shuts it down), or until serving
// fails, with that error.
func Serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() {
		if srv.TLSConfig != nil {
			errc <- srv.ServeTLS(ln, "", "") // HTTP/2 and HTTP/1.1 by ALPN
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
		return nil
	}
}

// Shutdown stops srv: it stops accepting, waits up to grace for the
// requests in flight, then closes the connections still open, so that a
// stuck client or a stream that does not end cannot hold the process's
// exit. It returns the graceful wait's error (context.DeadlineExceeded
// when connections had to be closed). Hijacked connections are their
// handlers' to close.
func Shutdown(ctx context.Context, srv *http.Server, grace time.Duration) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		srv.Close()
	}
	return err
}
