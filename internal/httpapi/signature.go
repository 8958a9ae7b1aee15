package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/url"
	"strconv"
	"time"
)

// Signature errors; their texts are API (reference §3.6, test-checked by
// the SDKs).
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
	sig := q.Get("signature")
	if sig == "" {
		return errMissingSignature
	}
	var exp *int64
	if v := q.Get("signature_expiration"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return errInvalidSignature
		}
		exp = &n
	}
	want := fileSignature(q.Get("path"), operation, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errInvalidSignature
	}
	if exp != nil && *exp < now.Unix() {
		return errExpiredSignature
	}
	return nil
}
