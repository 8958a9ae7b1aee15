package router

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/fencesandbox/fence/internal/cluster"
)

// serveAuditStream serves GET /audit/stream for the cluster: the live
// records of every live node's trail, merged as they come. Each node
// checks the caller's credential and sends only what the caller may read
// (its team's records), so the merge is the team's cluster-wide tail.
// A record's seq is its node's, so the merge drops the events' ids (a
// reconnect cannot resume where it stopped: Last-Event-ID is not passed
// on). Nodes that go live after the stream opened are read by the next
// stream. A node's refusal (a bad filter, a wrong key) is passed on when
// no node opened a stream.
func (rt *Router) serveAuditStream(w http.ResponseWriter, r *http.Request) {
	nodes := rt.nodes.Nodes()
	if len(nodes) == 0 {
		writeErr(w, http.StatusServiceUnavailable, "no fence node is live")
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	type opened struct {
		resp *http.Response
		err  error
	}
	answers := make([]opened, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			u, _ := url.Parse(n.URL)
			u.Path, u.RawQuery = r.URL.Path, r.URL.RawQuery
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
			if err != nil {
				answers[i].err = err
				return
			}
			for _, h := range []string{"X-API-Key", "Authorization", "X-Team-ID"} {
				if v := r.Header.Get(h); v != "" {
					req.Header.Set(h, v)
				}
			}
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set(cluster.HeaderToken, rt.token)
			answers[i].resp, answers[i].err = rt.tr.RoundTrip(req)
		})
	}
	wg.Wait()
	var streams []io.ReadCloser
	var refusal *http.Response
	for i, a := range answers {
		switch {
		case a.err != nil:
			rt.log.Warn("audit stream: node did not answer", "node", nodes[i].Name, "err", a.err)
		case a.resp.StatusCode == http.StatusOK:
			streams = append(streams, a.resp.Body)
		default:
			if refusal == nil {
				refusal = a.resp
			} else {
				a.resp.Body.Close()
			}
		}
	}
	if len(streams) == 0 {
		if refusal == nil {
			writeErr(w, http.StatusBadGateway, "no fence node answered")
			return
		}
		defer refusal.Body.Close()
		copyHeader(w.Header(), refusal.Header)
		w.WriteHeader(refusal.StatusCode)
		io.Copy(w, io.LimitReader(refusal.Body, 64<<10))
		return
	}
	if refusal != nil {
		refusal.Body.Close()
	}
	events := make(chan string)
	var readers sync.WaitGroup
	for _, body := range streams {
		readers.Go(func() {
			defer body.Close()
			readEvents(ctx, body, events)
		})
	}
	// The merge ends when every node's stream has.
	finished := make(chan struct{})
	go func() { readers.Wait(); close(finished) }()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for {
		select {
		case <-ctx.Done():
			return
		case <-finished:
			return
		case ev := <-events:
			if _, err := io.WriteString(w, ev); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
	}
}

// readEvents sends each event of an event stream, without its id, to out
// until the stream or ctx ends.
func readEvents(ctx context.Context, body io.Reader, out chan<- string) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var ev strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if line != "" {
			if !strings.HasPrefix(line, "id:") && !strings.HasPrefix(line, ":") {
				ev.WriteString(line + "\n")
			}
			continue
		}
		if ev.Len() == 0 {
			continue
		}
		select {
		case out <- ev.String() + "\n":
		case <-ctx.Done():
			return
		}
		ev.Reset()
	}
}
