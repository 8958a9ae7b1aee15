package volume

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
)

// A content API token is "fvt1.<claims>.<mac>": the claims (team, volume,
// expiry, a random ID) as base64url JSON and their HMAC-SHA256 under the
// daemon's key (<Dir>/token.key, made once, 0600). E2B's tokens are JWTs
// the SDK never reads; any bearer token scoped to the team and volume
// serves it.
const tokenPrefix = "fvt1."

type claims struct {
	Team   string `json:"teamid"`
	Volume string `json:"volid"`
	Exp    int64  `json:"exp"`
	ID     string `json:"jti"`
}

func (s *Service) token(v store.Volume) string {
	var jti [12]byte
	rand.Read(jti[:])
	b, _ := json.Marshal(claims{Team: v.Team, Volume: v.ID, Exp: s.now().Add(tokenLifetime).Unix(),
		ID: base64.RawURLEncoding.EncodeToString(jti[:])})
	body := base64.RawURLEncoding.EncodeToString(b)
	return tokenPrefix + body + "." + base64.RawURLEncoding.EncodeToString(s.mac(body))
}

func (s *Service) mac(body string) []byte {
	h := hmac.New(sha256.New, s.key)
	h.Write([]byte(tokenPrefix + body))
	return h.Sum(nil)
}

// errBadToken is every refused token's error: which check failed is not
// told.
var errBadToken = fmt.Errorf("invalid volume token: %w", api.ErrUnauthenticated)

// Authorize checks a content API token for volume id and returns the
// volume. A token of another volume, an expired or forged one is
// errBadToken; a valid token of a volume deleted since is a missing
// volume.
func (s *Service) Authorize(ctx context.Context, token, id string) (store.Volume, error) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return store.Volume{}, errBadToken
	}
	body, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return store.Volume{}, errBadToken
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(body)) {
		return store.Volume{}, errBadToken
	}
	raw, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return store.Volume{}, errBadToken
	}
	var c claims
	if err := json.Unmarshal(raw, &c); err != nil || c.Volume != id || s.now().Unix() >= c.Exp {
		return store.Volume{}, errBadToken
	}
	v, err := s.st.VolumeByID(ctx, c.Team, c.Volume)
	if err != nil {
		if errors.Is(err, store.ErrVolumeNotFound) {
			//lint:ignore ST1005 E2B's wording of the error
			return v, fmt.Errorf("Volume '%s' not found: %w", id, api.ErrNotFound)
		}
		return v, err
	}
	return v, nil
}
