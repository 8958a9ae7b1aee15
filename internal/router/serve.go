package router

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/fencesandbox/fence/internal/cluster"
	"github.com/fencesandbox/fence/internal/httpserve"
	"github.com/fencesandbox/fence/internal/ui"
)

// Config configures `fence router`, declared here only: each of the
// command's flags binds to a field (see internal/cli).
type Config struct {
	Addr string // listen address; required
	// Kubeconfig is the kubeconfig file; empty means in-cluster.
	Kubeconfig string
	Namespace  string // of the node Leases; required
	APIKey     string // required
	Token      string // the cluster token; required
	Domain     string
	// TLSCert and TLSKey make the router serve HTTPS (and HTTP/2).
	TLSCert, TLSKey string
	// NodeCA is a PEM bundle trusted for https:// node URLs instead of the
	// host's roots.
	NodeCA string
	// ShutdownDelay is how long the router keeps serving, with /health
	// answering 503, between SIGTERM and closing its listener, so load
	// balancers stop sending to it first.
	ShutdownDelay time.Duration
	// ShutdownGrace bounds the wait for requests in flight after that;
	// zero means 60 seconds.
	ShutdownGrace time.Duration
	// SharedRecords: the nodes share one database (Options.SharedRecords).
	SharedRecords bool
	// NoUI turns the dashboard at /ui off; UISessionTTL is a dashboard
	// session's life (0: DefaultUISessionTTL).
	NoUI         bool
	UISessionTTL time.Duration
	// SharedContent: the nodes share one content registry
	// (Options.SharedContent).
	SharedContent bool
	// MCP makes the router's /mcp handler (Options.MCP).
	MCP    func(api http.Handler) (handler http.Handler, stop func())
	Logger *slog.Logger
	Stdout io.Writer
}

// Serve runs the router until ctx is done, then shuts down gracefully.
func Serve(ctx context.Context, o Config) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := o.Stdout
	if out == nil {
		out = io.Discard
	}
	if o.Addr == "" || o.Namespace == "" {
		return errors.New("router: Addr and Namespace are required")
	}
	if o.APIKey == "" || o.Token == "" {
		return errors.New("router: the API key (FENCE_API_KEY) and the cluster token (FENCE_CLUSTER_TOKEN) are required")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	if o.NodeCA != "" {
		pem, err := os.ReadFile(o.NodeCA)
		if err != nil {
			return fmt.Errorf("reading node CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("node CA %s holds no PEM certificate", o.NodeCA)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	kube, err := cluster.NewClient(o.Kubeconfig, "fence-router")
	if err != nil {
		return err
	}
	// The watch runs until the router is done, past ctx: requests in
	// flight during the shutdown still find their nodes.
	wctx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatch()
	watcher, err := cluster.Watch(wctx, kube, o.Namespace, log)
	if err != nil {
		return err
	}
	opts := Options{Nodes: watcher, APIKey: o.APIKey, Token: o.Token, Domain: o.Domain, Transport: tr, Logger: log,
		SharedRecords: o.SharedRecords, UISessionTTL: o.UISessionTTL,
		SharedContent: o.SharedContent, MCP: o.MCP}
	if !o.NoUI {
		opts.UI = ui.Handler()
	}
	rt := New(opts)
	defer rt.Close()
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.Addr, err)
	}
	srv, err := httpserve.New(httpserve.Options{
		Handler:       rt,
		Logger:        log,
		HeaderTimeout: 10 * time.Second,
		IdleTimeout:   2 * time.Minute,
		TLSCert:       o.TLSCert,
		TLSKey:        o.TLSKey,
	})
	if err != nil {
		ln.Close()
		return err
	}
	scheme := httpserve.Scheme(srv)
	fmt.Fprintf(out, "fence: router serving the E2B API on %s://%s (%d nodes live)\n", scheme, ln.Addr(), len(watcher.Nodes()))
	if err := httpserve.Serve(ctx, srv, ln); err != nil {
		return err
	}
	fmt.Fprintln(out, "fence: router shutting down")
	rt.SetDraining()
	time.Sleep(o.ShutdownDelay)
	grace := o.ShutdownGrace
	if grace <= 0 {
		grace = 60 * time.Second
	}
	if err := httpserve.Shutdown(ctx, srv, grace); err != nil {
		return fmt.Errorf("requests still in flight after %s: %w", grace, err)
	}
	return nil
}
