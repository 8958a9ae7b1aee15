package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// interimMasker masks the headers of the informational (1xx) responses
// the proxy passes on as they come, before the final response (which
// modifyResponse masks): 103 Early Hints and the like leave for the
// sandbox from here.
type interimMasker struct {
	http.ResponseWriter
	st *reqState
}

func (m interimMasker) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		maskFields(m.Header(), m.st.masks)
	}
	m.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection's writer
// (flushes, full duplex, the hijack after a 101).
func (m interimMasker) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// maskFields masks a response's (or trailer's) fields: values are
// rewritten, and a field whose name holds a masked value, in any case,
// is dropped (a name cannot be rewritten to the placeholder and stay the
// same field; HTTP/1.1 canonicalises its case and HTTP/2 lower-cases it).
func maskFields(h http.Header, masks []needle) {
	if len(masks) == 0 {
		return
	}
	for k := range h {
		lk := strings.ToLower(k)
		for _, nd := range masks {
			if len(nd.find) > 0 && strings.Contains(lk, strings.ToLower(string(nd.find))) {
				delete(h, k)
				break
			}
		}
	}
	maskHeader(h, masks)
}

// cutRequestHeaders are dropped from requests whose answers are masked:
// each lets the client choose how the answer is cut, or ask for a digest
// of the body before masking.
var cutRequestHeaders = []string{"Range", "If-Range", "Want-Digest", "Want-Repr-Digest", "Want-Content-Digest"}

// digestHeaders are fields of a masked answer (and its trailers) that
// are dropped: they hash the body before masking, so they would let the
// sandbox check a guess of the value (and are wrong for the masked body).
var digestHeaders = []string{"Digest", "Content-Digest", "Repr-Digest", "Content-Md5"}

// isByteranges reports whether h is a multipart/byteranges body.
func isByteranges(h http.Header) bool {
	mt, _, _ := strings.Cut(h.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(mt), "multipart/byteranges")
}

// maskOf returns the needles that replace value (and its common
// encodings in echoes: JSON string escapes) by shown.
func maskOf(value, shown string) []needle {
	if value == "" {
		return nil
	}
	out := []needle{{find: []byte(value), replace: []byte(shown)}}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, html := range []bool{true, false} {
		b.Reset()
		enc.SetEscapeHTML(html)
		if enc.Encode(value) == nil {
			j := strings.TrimSuffix(b.String(), "\n")
			j = j[1 : len(j)-1]
			if j != value && !containsFind(out, j) {
				out = append(out, needle{find: []byte(j), replace: []byte(shown)})
			}
		}
	}
	return out
}

func containsFind(ns []needle, s string) bool {
	for _, n := range ns {
		if string(n.find) == s {
			return true
		}
	}
	return false
}

func maskHeader(h http.Header, masks []needle) {
	if len(masks) == 0 {
		return
	}
	for k, vs := range h {
		for i, v := range vs {
			vs[i] = replaceAll(v, masks)
		}
		h[k] = vs
	}
}
