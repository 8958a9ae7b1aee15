package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/internal/audit"
)

type recSink struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (s *recSink) Append(_ context.Context, ev audit.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, ev)
}

type recOutput struct {
	bytes.Buffer
	done bool
}

func (o *recOutput) Finish() (int64, string, int64) {
	o.done = true
	sum := sha256.Sum256(o.Bytes())
	return int64(o.Len()), hex.EncodeToString(sum[:]), int64(o.Len())
}

type recOutputs struct{ outs map[int]*recOutput }

func (k *recOutputs) Output(_ string, pid int) ProcessOutput {
	o := &recOutput{}
	k.outs[pid] = o
	return o
}

func envelope(flags byte, msg []byte) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// TestTapProcess drives a process.Start exchange through the tap, in both
// encodings, the response split at awkward places: the start is recorded
// with the request's argv and variable names (never values), the output
// is kept and hashed, the end is recorded with the exit code.
func TestTapProcess(t *testing.T) {
	for _, enc := range []string{"json", "proto"} {
		t.Run(enc, func(t *testing.T) {
			sink, outs := &recSink{}, &recOutputs{outs: map[int]*recOutput{}}
			h := &handler{sink: sink, outputs: outs}
			cwd := "/tmp"
			req := &process.StartRequest{Process: &process.ProcessConfig{Cmd: "sh", Args: []string{"-c", "echo hi"},
				Envs: map[string]string{"TOKEN": "s3cret-value", "A": "b"}, Cwd: &cwd}}
			marshal := func(m proto.Message) []byte {
				if enc == "json" {
					b, _ := protojson.Marshal(m)
					return b
				}
				b, _ := proto.Marshal(m)
				return b
			}
			ev := func(e *process.ProcessEvent) []byte { return envelope(0, marshal(&process.StartResponse{Event: e})) }
			stream := bytes.Join([][]byte{
				ev(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 42}}}),
				ev(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte("hi\n")}}}}),
				ev(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte("warn\n")}}}}),
				ev(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}}}),
				envelope(2, []byte("{}")),
			}, nil)
			r := httptest.NewRequest(http.MethodPost, "/process.Process/Start", bytes.NewReader(envelope(0, marshal(req))))
			r.Header.Set("Content-Type", "application/connect+"+enc)
			rec := httptest.NewRecorder()
			st := &proxyState{id: "sbx", path: "/process.Process/Start", user: "user", hasUser: true, actor: "envd-token"}
			w, r2, done := h.tapEnvd(rec, r, st)
			io.ReadAll(r2.Body) // the proxy reads the request
			for i := 0; i < len(stream); i += 7 {
				w.Write(stream[i:min(i+7, len(stream))])
			}
			done()
			if !bytes.Equal(rec.Body.Bytes(), stream) {
				t.Fatalf("the tap changed the response")
			}
			if len(sink.evs) != 2 {
				t.Fatalf("events = %+v, want start and end", sink.evs)
			}
			s, e := sink.evs[0], sink.evs[1]
			if s.Type != audit.TypeProcStart || s.Data["pid"] != 42 || s.Data["cmd"] != "sh" || s.Data["cwd"] != "/tmp" ||
				strings.Join(s.Data["env"].([]string), ",") != "A,TOKEN" || s.Data["user"] != "user" || s.SandboxID != "sbx" {
				t.Errorf("start = %+v", s)
			}
			for _, ev := range sink.evs {
				if strings.Contains(fmt.Sprint(ev.Data), "s3cret") {
					t.Errorf("a variable's value reached the audit trail: %+v", ev)
				}
			}
			sum := sha256.Sum256([]byte("hi\nwarn\n"))
			if e.Type != audit.TypeProcEnd || e.Data["exit_code"] != int32(3) || e.Data["output_bytes"] != int64(8) ||
				e.Data["output_sha256"] != hex.EncodeToString(sum[:]) || !outs.outs[42].done {
				t.Errorf("end = %+v", e)
			}
		})
	}
}

// TestTapUpload: an accepted upload records each file's path, size and
// sha256 as it went through; a refused one records nothing.
func TestTapUpload(t *testing.T) {
	for _, status := range []int{200, 403} {
		sink := &recSink{}
		h := &handler{sink: sink}
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", "/home/user/a.txt")
		content := strings.Repeat("x", 100000)
		fw.Write([]byte(content))
		mw.Close()
		r := httptest.NewRequest(http.MethodPost, "/files?path=/home/user/a.txt", &body)
		r.Header.Set("Content-Type", mw.FormDataContentType())
		rec := httptest.NewRecorder()
		w, r2, done := h.tapEnvd(rec, r, &proxyState{id: "sbx", path: "/files", actor: "envd-token"})
		io.Copy(io.Discard, r2.Body)
		w.WriteHeader(status)
		done()
		sum := sha256.Sum256([]byte(content))
		switch {
		case status == 200 && (len(sink.evs) != 1 || sink.evs[0].Data["path"] != "/home/user/a.txt" ||
			sink.evs[0].Data["size"] != int64(100000) || sink.evs[0].Data["sha256"] != hex.EncodeToString(sum[:])):
			t.Errorf("accepted upload: events %+v", sink.evs)
		case status != 200 && len(sink.evs) != 0:
			t.Errorf("refused upload recorded: %+v", sink.evs)
		}
	}
}

// TestTapUploadRaw: an upload whose body is the file itself.
func TestTapUploadRaw(t *testing.T) {
	sink := &recSink{}
	h := &handler{sink: sink}
	r := httptest.NewRequest(http.MethodPost, "/files?path=/tmp/raw.bin", strings.NewReader("raw bytes"))
	r.Header.Set("Content-Type", "application/octet-stream")
	rec := httptest.NewRecorder()
	w, r2, done := h.tapEnvd(rec, r, &proxyState{id: "sbx", path: "/files"})
	io.Copy(io.Discard, r2.Body)
	w.WriteHeader(200)
	done()
	sum := sha256.Sum256([]byte("raw bytes"))
	if len(sink.evs) != 1 || sink.evs[0].Data["path"] != "/tmp/raw.bin" || sink.evs[0].Data["sha256"] != hex.EncodeToString(sum[:]) {
		t.Errorf("events %+v", sink.evs)
	}
}
