package testutil

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// EarlyAnswer is a server's handler that answers a stream before its
// request body ends, as a sandbox's agent does (its start event while the
// request's last bytes may be in flight): it reads the body's first 5
// bytes, writes and flushes "start;", reads the rest and ends with
// "got BODY;end".
func EarlyAnswer() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		var first [5]byte
		if _, err := io.ReadFull(r.Body, first[:]); err != nil {
			return
		}
		io.WriteString(w, "start;")
		w.(http.Flusher).Flush()
		rest, _ := io.ReadAll(r.Body) // the client sends the rest now
		io.WriteString(w, "got "+string(first[:])+string(rest)+";end")
	})
}

// StreamAnsweredEarly sends streams to url (a proxy in front of
// EarlyAnswer) with the headers hdr, each body's end 100 ms after its
// start, and fails t unless every one gets the whole answer. Whether a
// proxy without full duplex cuts a stream depends on which of two readers
// gets the body's end first: a few streams make a run fail most of the
// time.
func StreamAnsweredEarly(t *testing.T, url string, hdr map[string]string) {
	t.Helper()
	for i := range 12 {
		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", url, pr)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		go func() {
			io.WriteString(pw, "hello")
			time.Sleep(100 * time.Millisecond) // the server answers meanwhile
			io.WriteString(pw, " world")
			pw.Close()
		}()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "start;got hello world;end" {
			t.Fatalf("stream %d through %s: %q, %v; want the whole answer", i, url, b, err)
		}
	}
}
