package process

import (
	"bytes"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/agent/users"
)

// flushCounter records the flushes that reach the connection's writer.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes []int // bytes written when each flush came
}

func (f *flushCounter) Flush() { f.flushes = append(f.flushes, f.Body.Len()) }

// TestStartEndIsNotFlushedAlone: a Start stream's start event is flushed
// at once; its end event is not flushed on its own but with the
// end-of-stream message, when the handler returns.
func TestStartEndIsNotFlushedAlone(t *testing.T) {
	s := NewService(Options{Users: &users.Resolver{DefaultUser: "root", DefaultWorkdir: t.TempDir()}})
	defer s.Close()
	_, h := s.Handler()
	msg := []byte(`{"process":{"cmd":"/bin/true"},"stdin":false}`)
	var body bytes.Buffer
	body.WriteByte(0)
	binary.Write(&body, binary.BigEndian, uint32(len(msg)))
	body.Write(msg)
	req := httptest.NewRequest(http.MethodPost, "/process.Process/Start", &body)
	req.Header.Set("Content-Type", "application/connect+json")
	w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
	h.ServeHTTP(w, req)
	out := w.Body.String()
	if w.Code != http.StatusOK || !strings.Contains(out, `"start"`) || !strings.Contains(out, `"end"`) {
		t.Fatalf("response %d %q", w.Code, out)
	}
	startEnd := strings.Index(out, `"end"`)
	if len(w.flushes) != 1 || w.flushes[0] > startEnd {
		t.Fatalf("flushes after %v bytes, want one, after the start event only (the end event starts at %d): %q", w.flushes, startEnd, out)
	}
}
