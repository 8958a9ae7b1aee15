package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"maps"
	"mime"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/internal/audit"
)

// OutputKeeper keeps what a process printed, for the audit trail.
type OutputKeeper interface {
	// Output returns the writer of one process's output.
	Output(sandboxID string, pid int) ProcessOutput
}

// ProcessOutput is one process's kept output.
type ProcessOutput interface {
	io.Writer
	// Finish closes it and returns the size and sha256 (hex) of all the
	// output and how much of it was kept.
	Finish() (size int64, sum string, kept int64)
}

// Bounds of what the audit tap reads of a request or a stream message.
const (
	tapMaxRequest = 1 << 20 // a Start request
	tapMaxMessage = 8 << 20 // one enveloped stream message
)

// tapEnvd wraps a request to a sandbox's agent and its response so that
// the daemon records, from the traffic it relays itself, the processes
// started through the API (process.Start: argv, variable names, cwd,
// user, pid, exit, output) and the files uploaded (POST /files: path,
// size, sha256). It changes nothing of either.
func (h *handler) tapEnvd(w http.ResponseWriter, r *http.Request, st *proxyState) (http.ResponseWriter, *http.Request, func()) {
	// A sandbox created with autoCheckpoint is checkpointed before each
	// command starts (a no-op for the others).
	if r.Method == http.MethodPost && st.path == "/process.Process/Start" && st.port == 0 {
		if h.layers != nil {
			h.layers.AutoCheckpoint(r.Context(), st.id)
		}
	}
	if h.sink == nil || r.Method != http.MethodPost {
		return w, r, func() {}
	}
	switch st.path {
	case "/process.Process/Start":
		t := &procTap{h: h, st: st, ctx: context.WithoutCancel(r.Context()), json: strings.Contains(r.Header.Get("Content-Type"), "json")}
		r.Body = &teeBody{ReadCloser: r.Body, buf: &t.req, max: tapMaxRequest}
		tw := &tapWriter{ResponseWriter: w, onData: t.feed}
		return tw, r, t.done
	case "/files":
		return h.tapUpload(w, r, st)
	}
	return w, r, func() {}
}

// procTap follows one process.Start stream.
type procTap struct {
	h    *handler
	st   *proxyState
	ctx  context.Context
	json bool
	req  bytes.Buffer

	env     envelopes
	pid     int
	started time.Time
	out     ProcessOutput
	ended   bool
}

func (t *procTap) feed(b []byte) {
	t.env.feed(b, func(flags byte, msg []byte) {
		if flags&0x02 != 0 { // end of stream
			return
		}
		var resp process.StartResponse
		var err error
		if t.json {
			err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(msg, &resp)
		} else {
			err = proto.Unmarshal(msg, &resp)
		}
		if err != nil || resp.GetEvent() == nil {
			return
		}
		ev := resp.GetEvent()
		switch {
		case ev.GetStart() != nil:
			t.start(int(ev.GetStart().GetPid()))
		case ev.GetData() != nil && t.out != nil:
			d := ev.GetData()
			t.out.Write(d.GetStdout())
			t.out.Write(d.GetStderr())
			t.out.Write(d.GetPty())
		case ev.GetEnd() != nil:
			t.end(ev.GetEnd())
		}
	})
}

// start records the process's start with what the request asked for.
func (t *procTap) start(pid int) {
	t.pid, t.started = pid, time.Now()
	data := map[string]any{"pid": pid, "user": t.st.user}
	if !t.st.hasUser {
		data["user"] = ""
	}
	var req process.StartRequest
	if msg, ok := firstEnvelope(t.req.Bytes()); ok {
		var err error
		if t.json {
			err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(msg, &req)
		} else {
			err = proto.Unmarshal(msg, &req)
		}
		if err == nil {
			p := req.GetProcess()
			data["cmd"] = p.GetCmd()
			data["args"] = p.GetArgs()
			// Names only: a value may be a secret.
			data["env"] = slices.Sorted(maps.Keys(p.GetEnvs()))
			data["cwd"] = p.GetCwd()
			data["pty"] = req.Pty != nil
			if req.Tag != nil {
				data["tag"] = req.GetTag()
			}
		}
	}
	t.h.sink.Append(t.ctx, audit.Event{Type: audit.TypeProcStart, SandboxID: t.st.id, Actor: t.st.actor, Data: data})
	if t.h.outputs != nil {
		t.out = t.h.outputs.Output(t.st.id, pid)
	}
}

func (t *procTap) end(e *process.ProcessEvent_EndEvent) {
	if t.ended || t.pid == 0 {
		return
	}
	t.ended = true
	data := map[string]any{"pid": t.pid, "exit_code": e.GetExitCode(), "exited": e.GetExited(),
		"status": e.GetStatus(), "duration_ms": time.Since(t.started).Milliseconds()}
	if e.Error != nil {
		data["error"] = e.GetError()
	}
	if t.out != nil {
		size, sum, kept := t.out.Finish()
		t.out = nil
		data["output_bytes"], data["output_sha256"], data["output_kept"] = size, sum, kept
	}
	t.h.sink.Append(t.ctx, audit.Event{Type: audit.TypeProcEnd, SandboxID: t.st.id, Actor: t.st.actor, Data: data})
}

// done runs when the stream is over: a process whose end the stream did
// not carry (the client went away, the sandbox died) is recorded as such.
func (t *procTap) done() {
	if t.pid == 0 || t.ended {
		return
	}
	t.ended = true
	data := map[string]any{"pid": t.pid, "detached": true, "duration_ms": time.Since(t.started).Milliseconds()}
	if t.out != nil {
		size, sum, kept := t.out.Finish()
		t.out = nil
		data["output_bytes"], data["output_sha256"], data["output_kept"] = size, sum, kept
	}
	t.h.sink.Append(t.ctx, audit.Event{Type: audit.TypeProcEnd, SandboxID: t.st.id, Actor: t.st.actor, Data: data})
}

// envelopes splits a Connect stream into its enveloped messages (a flags
// byte, a big-endian length, the message), across writes.
type envelopes struct {
	buf  []byte
	dead bool // a message over tapMaxMessage: stop parsing
}

func (e *envelopes) feed(b []byte, msg func(flags byte, m []byte)) {
	if e.dead {
		return
	}
	e.buf = append(e.buf, b...)
	for len(e.buf) >= 5 {
		n := int(binary.BigEndian.Uint32(e.buf[1:5]))
		if n > tapMaxMessage {
			e.dead, e.buf = true, nil
			return
		}
		if len(e.buf) < 5+n {
			return
		}
		msg(e.buf[0], e.buf[5:5+n])
		e.buf = e.buf[5+n:]
	}
	if len(e.buf) == 0 {
		e.buf = nil
	}
}

// firstEnvelope returns the first enveloped message of b.
func firstEnvelope(b []byte) ([]byte, bool) {
	if len(b) < 5 {
		return nil, false
	}
	n := int(binary.BigEndian.Uint32(b[1:5]))
	if len(b) < 5+n {
		return nil, false
	}
	return b[5 : 5+n], true
}

// teeBody copies what is read of a request body, up to max bytes.
type teeBody struct {
	io.ReadCloser
	buf *bytes.Buffer
	max int
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if room := t.max - t.buf.Len(); room > 0 && n > 0 {
		t.buf.Write(p[:min(n, room)])
	}
	return n, err
}

// tapWriter hands what is written to a response to onData as well.
type tapWriter struct {
	http.ResponseWriter
	onData func([]byte)
	status int
}

func (w *tapWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write passes b on to the client first and only then to the tap: what the
// tap does for an event (keeping a process's output ends with an fsync of
// its file) is not a wait the client's stream pays for.
func (w *tapWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	if w.onData != nil {
		if f, ok := w.ResponseWriter.(http.Flusher); ok && err == nil {
			f.Flush()
		}
		w.onData(b) // all of it, delivered or not: the audit keeps what the sandbox sent
	}
	return n, err
}

func (w *tapWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *tapWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// tapUpload records the files of an upload (POST /files) once the agent
// accepted it: the path, the size and sha256 of each file as it went
// through the daemon.
func (h *handler) tapUpload(w http.ResponseWriter, r *http.Request, st *proxyState) (http.ResponseWriter, *http.Request, func()) {
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	boundary := params["boundary"]
	qpath := r.URL.Query().Get("path")
	type file struct {
		path string
		size int64
		sum  string
	}
	var files []file
	pr, pw := io.Pipe()
	parsed := make(chan struct{})
	go func() {
		defer close(parsed)
		if err != nil || boundary == "" {
			// The body is the file itself (application/octet-stream).
			hs := sha256.New()
			n, _ := io.Copy(hs, pr)
			if qpath != "" {
				files = append(files, file{path: qpath, size: n, sum: hex.EncodeToString(hs.Sum(nil))})
			}
			return
		}
		mr := multipart.NewReader(pr, boundary)
		for {
			part, err := mr.NextPart()
			if err != nil {
				io.Copy(io.Discard, pr)
				return
			}
			hs := sha256.New()
			n, _ := io.Copy(hs, part)
			p := qpath
			if fn := part.FileName(); p == "" || (fn != "" && strings.HasPrefix(fn, "/")) {
				p = fn
			}
			files = append(files, file{path: p, size: n, sum: hex.EncodeToString(hs.Sum(nil))})
		}
	}()
	r.Body = &pipeTee{ReadCloser: r.Body, w: pw}
	tw := &tapWriter{ResponseWriter: w}
	ctx := context.WithoutCancel(r.Context())
	return tw, r, func() {
		pw.Close()
		<-parsed
		if tw.status < 200 || tw.status > 299 {
			return
		}
		for _, f := range files {
			h.sink.Append(ctx, audit.Event{Type: audit.TypeFileWrite, SandboxID: st.id, Actor: st.actor,
				Data: map[string]any{"path": f.path, "size": f.size, "sha256": f.sum, "user": st.user}})
		}
	}
}

// pipeTee copies a request body into a pipe as it is read; the pipe's
// reader must keep reading (it does: it discards what it cannot parse).
type pipeTee struct {
	io.ReadCloser
	w *io.PipeWriter
}

func (p *pipeTee) Read(b []byte) (int, error) {
	n, err := p.ReadCloser.Read(b)
	if n > 0 {
		p.w.Write(b[:n])
	}
	if err == io.EOF {
		p.w.Close()
	}
	return n, err
}
