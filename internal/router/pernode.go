package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/cluster"
)

// What each node keeps of its own, answered for the cluster by asking
// every live node with the caller's credentials (each node applies its
// tenancy: a team's key reads its team's records only) and merging:
//
//   - GET /audit: every node's records with the same filters, merged by
//     time (ties by node name, then seq), each node's in its own order,
//     each record with its "node". A node's seq means nothing on another,
//     so the router's ?after= is a cursor, "node:seq,…", given for the
//     next page in api.HeaderAuditCursor; limit bounds the merged page as
//     on one node.
//   - GET /audit/stream: the nodes' streams as one, each event with the
//     cursor as its id (Last-Event-ID resumes every node where it was).
//     It ends when any node's stream ends; the client reconnects.
//   - GET /audit/verify: each node's verification, by node.
//   - GET /usage: the sandboxes of every node by creation time, the totals
//     per key summed.
//
// A live node that does not answer is named in api.HeaderUnansweredNodes
// rather than left out silently. A node's refusal (a bad filter, a key it
// refuses) is the answer, as every node gives it alike.

const defaultAuditLimit = 1000 // a node's default page

// merged is the handler of r if it is one of the routes above, or nil.
func (rt *Router) merged(r *http.Request) http.HandlerFunc {
	if r.Method != http.MethodGet {
		return nil
	}
	switch r.URL.Path {
	case "/audit":
		return rt.auditQuery
	case "/audit/stream":
		return rt.auditStream
	case "/audit/verify":
		return rt.auditVerify
	case "/usage":
		return rt.usage
	}
	return nil
}

// auditCursor is a position in every node's audit trail: the seq of the
// last record read of each node, by node name.
type auditCursor map[string]uint64

func parseAuditCursor(v string, into auditCursor) error {
	if v == "" {
		return nil
	}
	for part := range strings.SplitSeq(v, ",") {
		i := strings.LastIndexByte(part, ':')
		if i <= 0 {
			return fmt.Errorf("after must be a cursor of fence router (node:seq,…, as in %s), got %q", api.HeaderAuditCursor, v)
		}
		n, err := strconv.ParseUint(part[i+1:], 10, 64)
		if err != nil {
			return fmt.Errorf("after must be a cursor of fence router (node:seq,…, as in %s), got %q", api.HeaderAuditCursor, v)
		}
		into[part[:i]] = max(into[part[:i]], n)
	}
	return nil
}

func (c auditCursor) String() string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(c)) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(name + ":" + strconv.FormatUint(c[name], 10))
	}
	return b.String()
}

// queryFor is q for node n: its own after.
func (c auditCursor) queryFor(q url.Values, n string) string {
	q = maps.Clone(q)
	q.Del("after")
	if seq := c[n]; seq > 0 {
		q.Set("after", strconv.FormatUint(seq, 10))
	}
	return q.Encode()
}

// auditEntry is one node's record as the merge sees it.
type auditEntry struct {
	raw  json.RawMessage
	node string
	seq  uint64
	time time.Time
}

// withNode adds "node" to a node's JSON object, unless it names one.
func withNode(raw json.RawMessage, node string) json.RawMessage {
	var has struct {
		Node *string `json:"node"`
	}
	raw = bytes.TrimSpace(raw)
	if json.Unmarshal(raw, &has) != nil || has.Node != nil || len(raw) < 2 || raw[0] != '{' {
		return raw
	}
	name, _ := json.Marshal(node)
	out := append([]byte(`{"node":`), name...)
	if rest := bytes.TrimSpace(raw[1:]); len(rest) > 0 && rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, raw[1:]...)
}

// unanswered sets api.HeaderUnansweredNodes to names, if any.
func unanswered(w http.ResponseWriter, names []string) {
	if len(names) > 0 {
		w.Header().Set(api.HeaderUnansweredNodes, strings.Join(names, ","))
	}
}

// answered splits a fan-out into the nodes' 200 answers and the names of
// those that did not answer; refused is the first other answer.
func (rt *Router) answered(what string, all []nodeAnswer) (ok []nodeAnswer, missing []string, refused *nodeAnswer) {
	for i, a := range all {
		switch {
		case a.err != nil:
			rt.log.Warn(what+": node did not answer", "node", a.node.Name, "err", a.err)
			missing = append(missing, a.node.Name)
		case a.status != http.StatusOK:
			if refused == nil {
				refused = &all[i]
			}
		default:
			ok = append(ok, a)
		}
	}
	return ok, missing, refused
}

// auditQuery is GET /audit for the cluster.
func (rt *Router) auditQuery(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cur := auditCursor{}
	if err := parseAuditCursor(q.Get("after"), cur); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	limit := defaultAuditLimit
	if n, err := strconv.Atoi(q.Get("limit")); err == nil && n > 0 {
		limit = n // a bad one: the nodes refuse it
	}
	ok, missing, refused := rt.answered("audit", rt.fanOutQuery(r, func(n cluster.Node) string { return cur.queryFor(q, n.Name) }))
	if refused != nil {
		writeAnswer(w, refused)
		return
	}
	var lists [][]auditEntry
	for _, a := range ok {
		var recs []json.RawMessage
		if err := json.Unmarshal(a.body, &recs); err != nil {
			rt.log.Warn("audit: bad answer from node", "node", a.node.Name, "err", err)
			missing = append(missing, a.node.Name)
			continue
		}
		list := make([]auditEntry, 0, len(recs))
		for _, raw := range recs {
			var rec struct {
				Seq  uint64    `json:"seq"`
				Time time.Time `json:"time"`
			}
			if json.Unmarshal(raw, &rec) == nil {
				list = append(list, auditEntry{raw: raw, node: a.node.Name, seq: rec.Seq, time: rec.Time})
			}
		}
		lists = append(lists, list)
	}
	page := mergeAudit(lists, limit)
	out := make([]json.RawMessage, len(page))
	for i, e := range page {
		out[i] = withNode(e.raw, e.node)
		cur[e.node] = e.seq
	}
	unanswered(w, missing)
	if s := cur.String(); s != "" {
		w.Header().Set(api.HeaderAuditCursor, s)
	}
	writeJSON(w, http.StatusOK, out)
}

// mergeAudit merges the nodes' lists (each in its node's order) by time,
// ties by node then seq, and keeps the first limit. Each list is taken
// from its head only, so what is kept of a node is a prefix of its list
// and a cursor at its last record loses none of it.
func mergeAudit(lists [][]auditEntry, limit int) []auditEntry {
	var out []auditEntry
	for len(out) < limit {
		best := -1
		for i, l := range lists {
			if len(l) == 0 {
				continue
			}
			if best < 0 || auditBefore(l[0], lists[best][0]) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out = append(out, lists[best][0])
		lists[best] = lists[best][1:]
	}
	return out
}

func auditBefore(a, b auditEntry) bool {
	if c := a.time.Compare(b.time); c != 0 {
		return c < 0
	}
	if a.node != b.node {
		return a.node < b.node
	}
	return a.seq < b.seq
}

// auditVerify is GET /audit/verify for the cluster: intact when every
// live node answered and its trail is intact; each node's report by name.
func (rt *Router) auditVerify(w http.ResponseWriter, r *http.Request) {
	// A node reads its whole trail: no bound but the client's.
	long := &http.Client{Transport: rt.tr, CheckRedirect: rt.client.CheckRedirect}
	all := rt.fanOutWith(r, long, func(cluster.Node) string { return r.URL.RawQuery })
	ok, missing, refused := rt.answered("audit verify", all)
	if refused != nil {
		writeAnswer(w, refused)
		return
	}
	out := struct {
		Intact     bool                       `json:"intact"`
		Records    uint64                     `json:"records"`
		Nodes      map[string]json.RawMessage `json:"nodes"`
		Unanswered []string                   `json:"unanswered"`
	}{Intact: len(missing) == 0, Nodes: map[string]json.RawMessage{}, Unanswered: append([]string{}, missing...)}
	for _, a := range ok {
		var rep struct {
			Intact  bool   `json:"intact"`
			Records uint64 `json:"records"`
		}
		if json.Unmarshal(a.body, &rep) != nil {
			out.Intact = false
			out.Unanswered = append(out.Unanswered, a.node.Name)
			continue
		}
		out.Intact = out.Intact && rep.Intact
		out.Records += rep.Records
		out.Nodes[a.node.Name] = bytes.TrimSpace(a.body)
	}
	unanswered(w, out.Unanswered)
	writeJSON(w, http.StatusOK, out)
}

// usage is GET /usage for the cluster: the shape of one node's answer,
// its sandboxes those of every node (by creation time) and its per-key
// totals the sums of the nodes'.
func (rt *Router) usage(w http.ResponseWriter, r *http.Request) {
	ok, missing, refused := rt.answered("usage", rt.fanOut(r))
	if refused != nil {
		writeAnswer(w, refused)
		return
	}
	type sandbox struct {
		raw     json.RawMessage
		created time.Time
	}
	var sandboxes []sandbox
	keys := map[string]map[string]any{}
	for _, a := range ok {
		var rep struct {
			Sandboxes []json.RawMessage `json:"sandboxes"`
			Keys      []json.RawMessage `json:"keys"`
		}
		if err := json.Unmarshal(a.body, &rep); err != nil {
			rt.log.Warn("usage: bad answer from node", "node", a.node.Name, "err", err)
			missing = append(missing, a.node.Name)
			continue
		}
		for _, raw := range rep.Sandboxes {
			var u struct {
				CreatedAt time.Time `json:"created_at"`
			}
			json.Unmarshal(raw, &u)
			sandboxes = append(sandboxes, sandbox{raw, u.CreatedAt})
		}
		for _, raw := range rep.Keys {
			addKeyUsage(keys, raw)
		}
	}
	slices.SortStableFunc(sandboxes, func(a, b sandbox) int { return a.created.Compare(b.created) })
	out := struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
		Keys      []map[string]any  `json:"keys"`
	}{Sandboxes: []json.RawMessage{}, Keys: []map[string]any{}}
	for _, s := range sandboxes {
		out.Sandboxes = append(out.Sandboxes, s.raw)
	}
	for _, actor := range slices.Sorted(maps.Keys(keys)) {
		out.Keys = append(out.Keys, keys[actor])
	}
	unanswered(w, missing)
	writeJSON(w, http.StatusOK, out)
}

// addKeyUsage adds one node's totals of a key to keys, by actor: numbers
// are summed (integers as integers), the rest kept.
func addKeyUsage(keys map[string]map[string]any, raw json.RawMessage) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var k map[string]any
	if d.Decode(&k) != nil {
		return
	}
	actor, _ := k["actor"].(string)
	sum := keys[actor]
	if sum == nil {
		keys[actor] = k
		return
	}
	for f, v := range k {
		n, ok := v.(json.Number)
		prev, pok := sum[f].(json.Number)
		if !ok || !pok {
			if _, has := sum[f]; !has {
				sum[f] = v
			}
			continue
		}
		a, aerr := n.Int64()
		b, berr := prev.Int64()
		if aerr == nil && berr == nil {
			sum[f] = json.Number(strconv.FormatInt(a+b, 10))
			continue
		}
		x, _ := n.Float64()
		y, _ := prev.Float64()
		sum[f] = json.Number(strconv.FormatFloat(x+y, 'g', -1, 64))
	}
}

// sseEvent is one event of a node's audit stream.
type sseEvent struct {
	node  string
	id    uint64
	event string // "" for a record
	data  []byte
	// beat is a keep-alive comment.
	beat bool
}

// auditStream is GET /audit/stream for the cluster.
func (rt *Router) auditStream(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cur := auditCursor{}
	for _, v := range []string{q.Get("after"), r.Header.Get("Last-Event-ID")} {
		if err := parseAuditCursor(v, cur); err != nil {
			writeErr(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	streams, missing, ok := rt.openStreams(ctx, w, r, cur)
	if !ok {
		return
	}
	events := make(chan sseEvent, 64)
	ended := make(chan struct{}, len(streams))
	for _, st := range streams {
		defer st.body.Close()
		go func() {
			readEvents(ctx, st.node, st.body, events)
			ended <- struct{}{}
		}()
	}
	unanswered(w, missing)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	for {
		select {
		case ev := <-events:
			var err error
			switch {
			case ev.beat:
				_, err = fmt.Fprint(w, ": keep-alive\n\n")
			case ev.event != "":
				fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.event, ev.data)
				rc.Flush()
				return // the client reconnects with Last-Event-ID
			default:
				cur[ev.node] = ev.id
				_, err = fmt.Fprintf(w, "id: %s\ndata: %s\n\n", cur, withNode(ev.data, ev.node))
			}
			if err != nil || rc.Flush() != nil {
				return
			}
		case <-ended:
			return // a node's stream ended: the client reconnects
		case <-ctx.Done():
			return
		}
	}
}

// nodeStream is one node's open audit stream.
type nodeStream struct {
	node string
	body io.ReadCloser
}

// openStreams opens every live node's audit stream from cur, at once. It
// has written the answer when ok is false: a node's refusal (a bad
// filter, a key refused: every node's alike), or none live.
func (rt *Router) openStreams(ctx context.Context, w http.ResponseWriter, r *http.Request, cur auditCursor) (streams []nodeStream, missing []string, ok bool) {
	nodes := rt.nodes.Nodes()
	if len(nodes) == 0 {
		writeErr(w, http.StatusServiceUnavailable, "no fence node is live")
		return nil, nil, false
	}
	resps := make([]*http.Response, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { resps[i], errs[i] = rt.openStream(ctx, r, n, cur.queryFor(r.URL.Query(), n.Name)) })
	}
	wg.Wait()
	for i, n := range nodes {
		switch {
		case errs[i] != nil:
			rt.log.Warn("audit stream: node did not answer", "node", n.Name, "err", errs[i])
			missing = append(missing, n.Name)
		case resps[i].StatusCode != http.StatusOK:
			b, _ := io.ReadAll(io.LimitReader(resps[i].Body, 64<<10))
			closeAll(resps, errs)
			writeAnswer(w, &nodeAnswer{node: n, status: resps[i].StatusCode, header: resps[i].Header, body: b})
			return nil, nil, false
		default:
			streams = append(streams, nodeStream{n.Name, resps[i].Body})
		}
	}
	if len(streams) == 0 {
		writeErr(w, http.StatusBadGateway, "no fence node answered")
		return nil, nil, false
	}
	return streams, missing, true
}

func closeAll(resps []*http.Response, errs []error) {
	for i, resp := range resps {
		if errs[i] == nil && resp != nil {
			resp.Body.Close()
		}
	}
}

// openStream opens node n's /audit/stream with the caller's credentials.
func (rt *Router) openStream(ctx context.Context, r *http.Request, n cluster.Node, query string) (*http.Response, error) {
	u, err := url.Parse(n.URL)
	if err != nil {
		return nil, err
	}
	u.Path, u.RawQuery = r.URL.Path, query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"X-API-Key", "Authorization"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set(cluster.HeaderToken, rt.token)
	return rt.tr.RoundTrip(req)
}

// readEvents sends the events of node's stream to out until it ends.
func readEvents(ctx context.Context, node string, body io.Reader, out chan<- sseEvent) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	ev := sseEvent{node: node}
	send := func(e sseEvent) bool {
		select {
		case out <- e:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.data != nil || ev.event != "" {
				if !send(ev) {
					return
				}
			}
			ev = sseEvent{node: node}
		case strings.HasPrefix(line, ":"):
			if !send(sseEvent{node: node, beat: true}) {
				return
			}
		case strings.HasPrefix(line, "id: "):
			ev.id, _ = strconv.ParseUint(strings.TrimPrefix(line, "id: "), 10, 64)
		case strings.HasPrefix(line, "event: "):
			ev.event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = append(ev.data, strings.TrimPrefix(line, "data: ")...)
		}
	}
}
