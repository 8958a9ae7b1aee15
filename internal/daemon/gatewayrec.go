package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"hash"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/httpapi"
	"github.com/fencesandbox/fence/internal/metrics"
)

// downloadSink keeps the package downloads the gateway records.
type downloadSink interface {
	RecordDownload(ctx context.Context, d gateway.Download) error
}

// gatewayRecorder counts and logs the egress gateway's decisions and
// keeps its download records. Refused requests (a placeholder sent where
// it may not go, a host the policy refuses) are logged at warning level,
// under the same per-sandbox allowance as refused flows; secret names are
// logged, values never reach it.
type gatewayRecorder struct {
	flows     *flowRecorder
	log       *slog.Logger
	requests  metrics.Counter
	secrets   metrics.Counter
	downloads downloadSink
	// audit, if set, gets every request decision, secret use and download.
	audit    audit.Sink
	recorded metrics.Counter
	dropped  metrics.Counter
	// queue carries download records to the writer, off the path of the
	// response they were recorded on.
	queue chan gateway.Download
	done  chan struct{}
	wg    sync.WaitGroup
}

func newGatewayRecorder(flows *flowRecorder, log *slog.Logger, reg *metrics.Registry, dl downloadSink) *gatewayRecorder {
	r := &gatewayRecorder{
		flows:     flows,
		log:       log,
		requests:  reg.Counter("fence_gateway_requests_total", "Requests the egress gateway decided, by decision and reason."),
		secrets:   reg.Counter("fence_gateway_secret_uses_total", "Secret values the egress gateway put into requests."),
		recorded:  reg.Counter("fence_gateway_downloads_total", "Package downloads the egress gateway recorded, by ecosystem."),
		dropped:   reg.Counter("fence_gateway_downloads_dropped_total", "Download records lost because the writer fell behind."),
		downloads: dl,
		queue:     make(chan gateway.Download, 1024),
		done:      make(chan struct{}),
	}
	r.wg.Go(r.write)
	return r
}

// write keeps the queued download records until close, then what is
// still queued.
func (r *gatewayRecorder) write() {
	keep := func(d gateway.Download) {
		if r.downloads == nil {
			return
		}
		if err := r.downloads.RecordDownload(context.Background(), d); err != nil {
			r.log.Error("recording a package download", "sandbox_id", d.SandboxID, "err", err)
		}
	}
	for {
		select {
		case d := <-r.queue:
			keep(d)
		case <-r.done:
			for {
				select {
				case d := <-r.queue:
					keep(d)
				default:
					return
				}
			}
		}
	}
}

// close stops the writer once the queued records are kept.
func (r *gatewayRecorder) close() {
	close(r.done)
	r.wg.Wait()
}

// Request implements gateway.Recorder.
func (r *gatewayRecorder) Request(ctx context.Context, ev gateway.Event) {
	decision := "allow"
	level := slog.LevelDebug
	if !ev.Allowed {
		decision, level = "deny", slog.LevelWarn
	}
	r.requests.Add(1, "decision", decision, "reason", ev.Reason)
	if r.audit != nil {
		d := map[string]any{"host": ev.Host, "method": ev.Method, "path": ev.Path, "decision": decision,
			"status": ev.Status, "bytes_out": ev.BytesOut, "bytes_in": ev.BytesIn}
		if ev.Reason != "" {
			d["reason"] = ev.Reason
		}
		if len(ev.Secrets) > 0 {
			d["secrets"] = ev.Secrets
		}
		r.audit.Append(ctx, audit.Event{Type: audit.TypeGateway, Time: ev.Time, SandboxID: ev.SandboxID, Actor: "sandbox", Data: d})
		if ev.Allowed {
			for _, name := range ev.Secrets {
				// A secret's name and where it went; never its value.
				r.audit.Append(ctx, audit.Event{Type: audit.TypeSecretUse, Time: ev.Time, SandboxID: ev.SandboxID, Actor: "sandbox",
					Data: map[string]any{"secret": name, "host": ev.Host, "method": ev.Method, "path": ev.Path}})
			}
		}
	}
	if len(ev.Secrets) > 0 && ev.Allowed {
		r.secrets.Add(int64(len(ev.Secrets)))
	}
	if !r.log.Enabled(ctx, level) {
		return
	}
	if level > slog.LevelDebug {
		if ok, _ := r.flows.allow(ev.SandboxID); !ok {
			return
		}
	}
	r.log.Log(ctx, level, "gateway request", "sandbox_id", ev.SandboxID, "host", ev.Host,
		"method", ev.Method, "path", ev.Path, "decision", decision, "reason", ev.Reason,
		"secrets", strings.Join(ev.Secrets, ","), "status", ev.Status,
		"bytes_out", ev.BytesOut, "bytes_in", ev.BytesIn)
}

// Download implements gateway.Recorder.
func (r *gatewayRecorder) Download(ctx context.Context, d gateway.Download) {
	r.recorded.Add(1, "ecosystem", d.Ecosystem)
	if r.audit != nil {
		r.audit.Append(ctx, audit.Event{Type: audit.TypeDownload, Time: d.Time, SandboxID: d.SandboxID, Actor: "sandbox",
			Data: map[string]any{"ecosystem": d.Ecosystem, "name": d.Name, "version": d.Version, "url": d.URL,
				"size": d.Size, "sha256": d.SHA256}})
	}
	r.log.InfoContext(ctx, "package download", "sandbox_id", d.SandboxID, "ecosystem", d.Ecosystem,
		"name", d.Name, "version", d.Version, "url", d.URL, "size", d.Size, "sha256", d.SHA256)
	select {
	case r.queue <- d:
	default:
		r.dropped.Add(1)
	}
}

// newGateway loads (or makes) the gateway's CA under DataDir/gateway and
// the roots upstream servers are verified with, and returns the gateway
// and the CA certificate sandboxes trust.
func newGateway(opts Config, sec gateway.Secrets, rec gateway.Recorder, log *slog.Logger) (*gateway.Gateway, []byte, error) {
	ca, err := gateway.LoadOrCreateCA(filepath.Join(opts.DataDir, "gateway"))
	if err != nil {
		return nil, nil, fmt.Errorf("loading the egress gateway's CA: %w", err)
	}
	var roots *x509.CertPool
	if opts.UpstreamCA != "" {
		pem, err := os.ReadFile(opts.UpstreamCA)
		if err != nil {
			return nil, nil, fmt.Errorf("reading --upstream-ca: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("--upstream-ca %s: no PEM certificate in it", opts.UpstreamCA)
		}
	}
	gw, err := gateway.New(gateway.Options{CA: ca, Roots: roots, Secrets: sec, Recorder: rec, Logger: log.With("component", "gateway")})
	if err != nil {
		return nil, nil, fmt.Errorf("starting the egress gateway: %w", err)
	}
	return gw, ca.CertPEM(), nil
}

// auditOutputs keeps the output of processes started through the proxy
// in the audit log's output store (stdout, stderr and a PTY's output in
// one stream, in the order they came).
type auditOutputs struct{ l *audit.Log }

// Output implements httpapi.OutputKeeper.
func (a auditOutputs) Output(sandboxID string, pid int) httpapi.ProcessOutput {
	o, err := a.l.Output(sandboxID, pid, "output")
	if err != nil {
		return &hashOnly{h: sha256.New()}
	}
	return &auditOutput{o: o}
}

type auditOutput struct{ o *audit.Output }

func (a *auditOutput) Write(p []byte) (int, error) { return a.o.Write(p) }

func (a *auditOutput) Finish() (int64, string, int64) {
	a.o.Close()
	s := a.o.Sum()
	return s.Size, s.SHA256, s.Kept
}

// hashOnly counts and hashes an output the store could not take.
type hashOnly struct {
	h    hash.Hash
	size int64
}

func (o *hashOnly) Write(p []byte) (int, error) {
	o.size += int64(len(p))
	return o.h.Write(p)
}

func (o *hashOnly) Finish() (int64, string, int64) {
	return o.size, hex.EncodeToString(o.h.Sum(nil)), 0
}
