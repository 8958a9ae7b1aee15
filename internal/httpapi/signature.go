package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Signature errors; their texts are API: the SDKs check them.
var (
	errMissingSignature = errors.New("missing signature query parameter")
	errInvalidSignature = errors.New("invalid signature")
	errExpiredSignature = errors.New("signature is already expired")
)

// fileSignature is the SDKs' /files URL signature: "v1_" and the unpadded
// standard base64 of sha256("path:operation:user:token[:expiration]").
func fileSignature(path, operation, user, token string, expiration *int64) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != nil {
		raw += ":" + strconv.FormatInt(*expiration, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// checkSignature validates the signature query parameters of a /files
// request, in envd's order: presence, match, then expiry.
func checkSignature(q url.Values, operation, token string, now time.Time) error {
	sr, err := parseSigned(q, operation)
	if err != nil {
		return err
	}
	return sr.check(token, now)
}

// signedRequest is the signed part of a /files request, parsed once so it
// can be checked against many tokens.
type signedRequest struct {
	sig    []byte
	prefix string // "path:operation:user:"
	suffix string // ":expiration", or empty
	exp    *int64
}

func parseSigned(q url.Values, operation string) (*signedRequest, error) {
	sig := q.Get("signature")
	if sig == "" {
		return nil, errMissingSignature
	}
	sr := &signedRequest{sig: []byte(sig), prefix: q.Get("path") + ":" + operation + ":" + q.Get("username") + ":"}
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, errInvalidSignature
		}
		sr.exp = &n
		sr.suffix = ":" + strconv.FormatInt(n, 10)
	}
	return sr, nil
}

// check reports whether the request is signed with token and unexpired.
func (sr *signedRequest) check(token string, now time.Time) error {
	sum := sha256.Sum256([]byte(sr.prefix + token + sr.suffix))
	var want [3 + 43]byte
	copy(want[:], "v1_")
	base64.RawStdEncoding.Encode(want[3:], sum[:])
	if subtle.ConstantTimeCompare(sr.sig, want[:]) != 1 {
		return errInvalidSignature
	}
	if sr.exp != nil && *sr.exp < now.Unix() {
		return errExpiredSignature
	}
	return nil
}

// wellFormedSignature reports whether sig has the shape of a v1 signature,
// "v1_" and 43 characters of unpadded standard base64.
func wellFormedSignature(sig string) bool {
	b64, ok := strings.CutPrefix(sig, "v1_")
	if !ok || len(b64) != base64.RawStdEncoding.EncodedLen(sha256.Size) {
		return false
	}
	_, err := base64.RawStdEncoding.Strict().DecodeString(b64)
	return err == nil
}

// maxSignatureScans is how many requests may match a new signature against
// every sandbox's token at once (about 0.7 µs per token): half the CPUs.
func maxSignatureScans() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// maxIndexedSignatures bounds the signature index.
const maxIndexedSignatures = 4096

// signatureIndex maps signatures that verified to their sandbox. An entry
// is a hint, checked again on use, so a stale one is harmless.
type signatureIndex struct {
	mu sync.Mutex
	// +checklocks:mu
	ids map[string]string
}

func (x *signatureIndex) get(sig string) (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	id, ok := x.ids[sig]
	return id, ok
}

func (x *signatureIndex) add(sig, id string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ids == nil {
		x.ids = map[string]string{}
	}
	if len(x.ids) >= maxIndexedSignatures {
		for k := range x.ids { // drop an arbitrary entry
			delete(x.ids, k)
			break
		}
	}
	x.ids[sig] = id
}

func (x *signatureIndex) remove(sig string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.ids, sig)
}
