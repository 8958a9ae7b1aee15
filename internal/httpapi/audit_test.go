package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/audit"
)

// newAuditEnv is a test env whose API serves a real audit log.
func newAuditEnv(t *testing.T) (*testEnv, *audit.Log) {
	t.Helper()
	e := newTestEnv(t)
	al, err := audit.Open(audit.Options{Dir: t.TempDir(), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(Options{Manager: e.m, Pauses: e.m.Pauses(), Network: e.net, APIKey: testKey, Domain: "fence.test", Audit: al, Identity: e.st}))
	t.Cleanup(func() {
		srv.Close()
		al.Close()
	})
	e.srv = srv
	return e, al
}

func appendSync(t *testing.T, al *audit.Log, evs ...audit.Event) {
	t.Helper()
	for _, ev := range evs {
		al.Append(context.Background(), ev)
	}
	if err := al.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestAuditQuery(t *testing.T) {
	e, al := newAuditEnv(t)
	if resp, _ := e.do(t, "GET", "/audit", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a key: %d", resp.StatusCode)
	}
	appendSync(t, al,
		audit.Event{Type: audit.TypeCreate, SandboxID: "sba", Actor: "key:1"},
		audit.Event{Type: audit.TypeProcStart, SandboxID: "sba", Data: map[string]any{"pid": 7}},
		audit.Event{Type: audit.TypeProcStart, SandboxID: "sbb"},
		audit.Event{Type: audit.TypeKill, SandboxID: "sba"},
	)
	resp, body := e.do(t, "GET", "/audit?sandbox=sba&type=process.start,sandbox.kill", "", "X-API-Key: "+testKey)
	var recs []audit.Record
	// Seq 1 is the refused request above (the API's own record).
	if resp.StatusCode != 200 || json.Unmarshal(body, &recs) != nil || len(recs) != 2 || recs[0].Seq != 3 || recs[1].Type != audit.TypeKill {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "GET", "/audit?after=2&limit=1", "", "X-API-Key: "+testKey)
	if json.Unmarshal(body, &recs) != nil || len(recs) != 1 || recs[0].Seq != 3 {
		t.Fatalf("after: %d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "GET", "/audit?since=1h", "", "X-API-Key: "+testKey)
	if json.Unmarshal(body, &recs) != nil || len(recs) != 5 {
		t.Fatalf("since 1h: %d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "GET", "/audit?sandbox=none", "", "X-API-Key: "+testKey)
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "[]" {
		t.Fatalf("no match: %d %s", resp.StatusCode, body)
	}
	for _, q := range []string{"since=yesterday", "limit=0", "limit=x", "after=-1", "until=2026"} {
		if resp, body := e.do(t, "GET", "/audit?"+q, "", "X-API-Key: "+testKey); resp.StatusCode != 400 {
			t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
		}
	}
}

// sseEvent is one event read from a stream.
type sseEvent struct{ id, data string }

func readEvents(t *testing.T, sc *bufio.Scanner, n int) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	for len(out) < n && sc.Scan() {
		l := sc.Text()
		switch {
		case l == "":
			if cur.data != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(l, "id: "):
			cur.id = strings.TrimPrefix(l, "id: ")
		case strings.HasPrefix(l, "data: "):
			cur.data = strings.TrimPrefix(l, "data: ")
		}
	}
	if len(out) < n {
		t.Fatalf("stream ended after %d events: %v", len(out), sc.Err())
	}
	return out
}

func openStream(t *testing.T, e *testEnv, query, lastID string) (*bufio.Scanner, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/audit/stream?"+query, nil)
	req.Header.Set("X-API-Key", testKey)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header)
	}
	return bufio.NewScanner(resp.Body), func() { cancel(); resp.Body.Close() }
}

func TestAuditStream(t *testing.T) {
	e, al := newAuditEnv(t)
	appendSync(t, al, audit.Event{Type: audit.TypeCreate, SandboxID: "s1"}) // seq 1, before the stream
	sc, stop := openStream(t, e, "sandbox=s1", "")
	// The backlog first, then live records as they are committed.
	got := readEvents(t, sc, 1)
	if got[0].id != "1" {
		t.Fatalf("backlog: %+v", got)
	}
	appendSync(t, al,
		audit.Event{Type: audit.TypeProcStart, SandboxID: "other"},
		audit.Event{Type: audit.TypeProcStart, SandboxID: "s1", Data: map[string]any{"pid": 1}},
		audit.Event{Type: audit.TypeProcEnd, SandboxID: "s1", Data: map[string]any{"pid": 1}},
	)
	got = readEvents(t, sc, 2)
	var r audit.Record
	if json.Unmarshal([]byte(got[1].data), &r) != nil || got[0].id != "3" || got[1].id != "4" || r.Type != audit.TypeProcEnd || r.Seq != 4 {
		t.Fatalf("live: %+v", got)
	}
	stop()
	// Records while disconnected arrive on resuming with Last-Event-ID,
	// once each.
	appendSync(t, al, audit.Event{Type: audit.TypeKill, SandboxID: "s1"})
	sc, stop = openStream(t, e, "sandbox=s1", "4")
	defer stop()
	got = readEvents(t, sc, 1)
	if got[0].id != "5" {
		t.Fatalf("resumed: %+v", got)
	}
	appendSync(t, al, audit.Event{Type: audit.TypeAPI, SandboxID: "s1"})
	if got = readEvents(t, sc, 1); got[0].id != "6" {
		t.Fatalf("after resuming: %+v", got)
	}
}

func TestSandboxLogs(t *testing.T) {
	e, al := newAuditEnv(t)
	resp, body := e.do(t, "POST", "/sandboxes", `{"templateID":"base"}`, "X-API-Key: "+testKey)
	var sb api.Sandbox
	if resp.StatusCode != 201 || json.Unmarshal(body, &sb) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	id := sb.SandboxID
	// A sandbox with no records yet: empty lists, not null.
	resp, body = e.do(t, "GET", "/sandboxes/"+id+"/logs", "", "X-API-Key: "+testKey)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"logs":[]`) || !strings.Contains(string(body), `"logEntries":[]`) {
		t.Fatalf("v1 empty: %d %s", resp.StatusCode, body)
	}
	resp, body = e.do(t, "GET", "/v2/sandboxes/"+id+"/logs", "", "X-API-Key: "+testKey)
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != `{"logs":[]}` {
		t.Fatalf("v2 empty: %d %s", resp.StatusCode, body)
	}
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	appendSync(t, al,
		audit.Event{Type: audit.TypeCreate, SandboxID: id, Time: t0, Actor: "key:ab"},
		audit.Event{Type: audit.TypeProcStart, SandboxID: id, Time: t0.Add(time.Second), Data: map[string]any{"pid": 12, "argv": []string{"curl", "example.com"}, "env": map[string]any{"names": "A,B"}}},
		audit.Event{Type: audit.TypeFlow, SandboxID: id, Time: t0.Add(2 * time.Second), Data: map[string]any{"allowed": false, "host": "evil.example", "reason": "not in allowOut"}},
		audit.Event{Type: audit.TypeProcEnd, SandboxID: id, Time: t0.Add(3 * time.Second), Data: map[string]any{"pid": 12, "exit_code": 7}},
		audit.Event{Type: audit.TypeProcEnd, SandboxID: "killedlongago", Time: t0.Add(3 * time.Second)},
	)
	resp, body = e.do(t, "GET", "/sandboxes/"+id+"/logs", "", "X-API-Key: "+testKey)
	var v1 api.SandboxLogs
	if resp.StatusCode != 200 || json.Unmarshal(body, &v1) != nil || len(v1.Logs) != 4 || len(v1.LogEntries) != 4 {
		t.Fatalf("v1: %d %s", resp.StatusCode, body)
	}
	ent := v1.LogEntries[1]
	if !ent.Timestamp.Equal(t0.Add(time.Second)) || ent.Level != "info" || !strings.Contains(ent.Message, "process.start pid=12") ||
		ent.Fields["pid"] != "12" || ent.Fields["argv"] != `["curl","example.com"]` || ent.Fields["env.names"] != "A,B" || ent.Fields["type"] != audit.TypeProcStart {
		t.Fatalf("entry %+v", ent)
	}
	var line audit.Record
	if json.Unmarshal([]byte(v1.Logs[1].Line), &line) != nil || line.Type != audit.TypeProcStart || line.Sandbox != id {
		t.Fatalf("v1 line %q", v1.Logs[1].Line)
	}
	_, body = e.do(t, "GET", "/sandboxes/"+id+"/logs?start="+itoa(t0.Add(2*time.Second).UnixMilli())+"&limit=1", "", "X-API-Key: "+testKey)
	if json.Unmarshal(body, &v1) != nil || len(v1.LogEntries) != 1 || v1.LogEntries[0].Fields["type"] != audit.TypeFlow {
		t.Fatalf("v1 start/limit: %s", body)
	}

	var v2 api.SandboxLogsV2
	get2 := func(q string) []api.SandboxLogEntry {
		t.Helper()
		resp, body := e.do(t, "GET", "/v2/sandboxes/"+id+"/logs?"+q, "", "X-API-Key: "+testKey)
		v2 = api.SandboxLogsV2{}
		if resp.StatusCode != 200 || json.Unmarshal(body, &v2) != nil {
			t.Fatalf("v2 %s: %d %s", q, resp.StatusCode, body)
		}
		return v2.Logs
	}
	if l := get2("level=warn"); len(l) != 1 || l[0].Level != "warn" || !strings.Contains(l[0].Message, "allowed=false") {
		t.Fatalf("level=warn: %+v", l)
	}
	if l := get2("search=exit_code%3D7"); len(l) != 1 || l[0].Fields["exit_code"] != "7" {
		t.Fatalf("search: %+v", l)
	}
	if l := get2("direction=backward&limit=2"); len(l) != 2 || l[0].Fields["type"] != audit.TypeProcEnd || l[1].Fields["type"] != audit.TypeFlow {
		t.Fatalf("backward: %+v", l)
	}
	if l := get2("direction=backward&cursor=" + itoa(t0.Add(time.Second).UnixMilli())); len(l) != 2 || l[0].Fields["type"] != audit.TypeProcStart {
		t.Fatalf("backward from cursor: %+v", l)
	}
	if l := get2("cursor=" + itoa(t0.Add(3*time.Second).UnixMilli())); len(l) != 1 || l[0].Fields["type"] != audit.TypeProcEnd {
		t.Fatalf("forward from cursor: %+v", l)
	}
	for _, q := range []string{"limit=1001", "direction=up", "level=loud", "cursor=x", "search=" + strings.Repeat("a", 257)} {
		if resp, body := e.do(t, "GET", "/v2/sandboxes/"+id+"/logs?"+q, "", "X-API-Key: "+testKey); resp.StatusCode != 400 {
			t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
		}
	}
	// A sandbox fence never knew: 404 on both; one known only from its
	// records (killed long ago): 200.
	for _, p := range []string{"/sandboxes/inever0existed/logs", "/v2/sandboxes/inever0existed/logs"} {
		if resp, body := e.do(t, "GET", p, "", "X-API-Key: "+testKey); resp.StatusCode != 404 {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, body)
		}
	}
	if resp, body := e.do(t, "GET", "/v2/sandboxes/killedlongago/logs", "", "X-API-Key: "+testKey); resp.StatusCode != 200 || !strings.Contains(string(body), "process.end") {
		t.Fatalf("known from records: %d %s", resp.StatusCode, body)
	}
	if resp, _ := e.do(t, "GET", "/v2/sandboxes/"+id+"/logs", ""); resp.StatusCode != 401 {
		t.Fatalf("without a key: %d", resp.StatusCode)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestAuditStreamSlowClient opens a stream and does not read it while far
// more records than the TCP buffers and the subscriber's buffer hold are
// committed: the writer is never held up, and the stream ends with an
// error event instead of delivering them all.
func TestAuditStreamSlowClient(t *testing.T) {
	e, al := newAuditEnv(t)
	sc, stop := openStream(t, e, "", "")
	defer stop()
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	big := strings.Repeat("x", 4000)
	const total = 8000
	for range total {
		al.Append(context.Background(), audit.Event{Type: audit.TypeAPI, Data: map[string]any{"pad": big}})
	}
	if err := al.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if al.Committed() < total || al.Dropped() != 0 {
		t.Fatalf("writer: committed %d, dropped %d", al.Committed(), al.Dropped())
	}
	n, sawError := 0, false
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "id: ") {
			n++
		}
		if l == "event: error" {
			sawError = true
		}
	}
	if !sawError || n >= total {
		t.Fatalf("a slow client got %d of %d records, error event %v", n, total, sawError)
	}
	t.Logf("the slow client got %d of %d records, then was disconnected", n, total)
}
