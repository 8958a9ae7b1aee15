package sudo

import (
	"bytes"
	"io"
	"reflect"
	"testing"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		args []string
		want *request // nil: exits at once
		code int
	}{
		{[]string{"id"}, &request{Argv: []string{"id"}}, 0},
		{[]string{"-n", "-u", "user", "--", "ls", "-l"}, &request{Argv: []string{"ls", "-l"}, User: "user"}, 0},
		{[]string{"-uuser", "ls"}, &request{Argv: []string{"ls"}, User: "user"}, 0},
		{[]string{"-i"}, &request{Login: true, Argv: []string{}}, 0},
		{[]string{"-s", "echo", "hi"}, &request{Shell: true, Argv: []string{"echo", "hi"}}, 0},
		{[]string{"-k"}, nil, 0},
		{[]string{"-x", "ls"}, nil, 1},
		{[]string{}, nil, 1},
		{[]string{"-u"}, nil, 1},
	}
	for _, tt := range tests {
		req, code, done := parseArgs(tt.args, io.Discard)
		if tt.want == nil {
			if !done || code != tt.code {
				t.Errorf("parseArgs(%q) = %+v, %d, %v; want exit %d", tt.args, req, code, done, tt.code)
			}
			continue
		}
		if done {
			t.Errorf("parseArgs(%q) exits with %d, want a request", tt.args, code)
			continue
		}
		req.Env = nil
		if tt.want.Argv == nil {
			tt.want.Argv = []string{}
		}
		if len(req.Argv) == 0 {
			req.Argv = []string{}
		}
		if !reflect.DeepEqual(req, tt.want) {
			t.Errorf("parseArgs(%q) = %+v, want %+v", tt.args, req, tt.want)
		}
	}
}

func TestRequestRoundTrip(t *testing.T) {
	in := &request{Argv: []string{"echo", "hi"}, User: "root", Dir: "/tmp", Env: map[string]string{"TERM": "xterm"}}
	b, err := encodeRequest(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := decodeRequest(b)
	if err != nil || !reflect.DeepEqual(in, out) {
		t.Errorf("decode(encode(%+v)) = %+v, %v", in, out, err)
	}
	for _, bad := range [][]byte{nil, {0, 0, 0, 9, '{'}, {0, 0, 0, 2, '{', '}'}} {
		if _, err := decodeRequest(bad); err == nil {
			t.Errorf("decodeRequest(%q) accepted", bad)
		}
	}
}

// FuzzDecodeRequest: what a sandbox process sends the agent's sudo socket
// never panics the decoder.
func FuzzDecodeRequest(f *testing.F) {
	good, _ := encodeRequest(&request{Argv: []string{"id"}})
	f.Add(good)
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRequest(b); err == nil && len(r.Argv) == 0 && !r.Login && !r.Shell {
			t.Errorf("decodeRequest(%q) accepted a request without a command", b)
		}
	})
}

// On a stream the request may come in pieces, with the client's first
// signals right behind it.
func TestReadRequestFromStream(t *testing.T) {
	req, _ := encodeRequest(&request{Argv: []string{"id"}})
	sig := []byte{msgSignal, 0, 0, 0, 2}
	for _, first := range []int{1, 3, 4, 7, len(req), len(req) + 2} {
		stream := append(append([]byte(nil), req...), sig...)
		buf := make([]byte, maxRequest+4)
		n := copy(buf, stream[:first])
		r := bytes.NewReader(stream[first:])
		got, extra, err := readRequest(r, buf, n)
		if err != nil || !bytes.Equal(got, req) {
			t.Errorf("first read of %d bytes: request %q, %v", first, got, err)
			continue
		}
		rest, _ := io.ReadAll(io.MultiReader(bytes.NewReader(extra), r))
		if !bytes.Equal(rest, sig) {
			t.Errorf("first read of %d bytes: after the request %q, want %q", first, rest, sig)
		}
	}
	if _, _, err := readRequest(bytes.NewReader(nil), []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, 8); err == nil {
		t.Error("readRequest took a length past its buffer")
	}
}
