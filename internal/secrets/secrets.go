// Package secrets is fence's secret store: named values that the egress
// gateway puts into a sandbox's outbound requests, and that never enter a
// sandbox or leave the daemon through the API.
//
// # Guarantees
//
//   - A value is stored only sealed with AES-256-GCM under a key of its
//     own file in the data directory (32 random bytes, mode 0600, made on
//     first use by writing a temporary file and linking it into place). A
//     key file its group or others may access, or owned by another user,
//     is refused.
//   - Every sealing takes a fresh random nonce, and the secret's ID and
//     version are its additional data: a sealed value copied to another
//     row or version does not open.
//   - No method returns a value except Value, which the gateway calls;
//     values are never logged, and errors never hold them.
//   - Names are canonical (lower case, [a-z0-9_-], 1..128 bytes, not
//     starting with sec_) and unique; IDs are sec_ and the typeid suffix of
//     a UUIDv7. Versions start at 1 and grow by one per update.
//   - Bad input is an error wrapping api.ErrInvalidArgument and changes
//     nothing; an unknown secret wraps api.ErrNotFound; a taken name or a
//     full store wraps api.ErrConflict.
package secrets

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/gateway"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Limits on what one secret and the store hold.
const (
	// MaxValueBytes bounds a value.
	MaxValueBytes = 64 << 10
	// MaxSecrets bounds the number of secrets.
	MaxSecrets = 10_000
	// Metadata bounds.
	MaxMetadataEntries    = 32
	MaxMetadataKeyBytes   = 128
	MaxMetadataValueBytes = 1024
	MaxMetadataBytes      = 8192 // keys and values together
)

// ErrBackend marks a failure of the store itself (its key, its database):
// not the caller's fault.
var ErrBackend = errors.New("secrets backend error")

// Secret is what the store tells about a secret: everything but its value.
type Secret struct {
	ID        string
	Name      string
	Version   int64
	Metadata  map[string]string // never nil
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Options configure a Store.
type Options struct {
	// DB holds the records. Required.
	DB *store.Store
	// KeyPath is the key file. Required.
	KeyPath string
	// NoCreate refuses to make a missing key file: the key is given (a
	// cluster's, which every node reads), so Open fails without it.
	NoCreate bool
	// MaxSecrets caps the number of secrets; zero means MaxSecrets.
	MaxSecrets int
	// TeamMax, if set, returns the number of secrets a team may keep (0:
	// no limit); a create over it wraps api.ErrResourceExhausted.
	TeamMax func(team string) int
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Store is the secret store. It is safe for concurrent use.
type Store struct {
	db      *store.Store
	keyPath string
	max     int
	teamMax func(team string) int // nil: no per-team limit
	now     func() time.Time

	// updates serializes Update in this process, so concurrent updates of
	// a secret queue instead of racing on its version (the store's
	// version check still guards against any other writer).
	updates sync.Mutex

	mu sync.Mutex
	// +checklocks:mu
	aead cipher.AEAD // nil until the key is loaded or made
}

var _ gateway.Secrets = (*Store)(nil)

// Open returns the store. A key file that exists is checked and loaded
// now, so a bad one fails the daemon's start; a missing one is made when
// the first value is stored.
func Open(opts Options) (*Store, error) {
	if opts.DB == nil || opts.KeyPath == "" {
		return nil, errors.New("secrets: DB and KeyPath are required")
	}
	var aead cipher.AEAD
	key, err := readKey(opts.KeyPath)
	switch {
	case errors.Is(err, errNoKey) && opts.NoCreate:
		return nil, fmt.Errorf("secrets key %s is missing: every node of a cluster reads the one key given to it", opts.KeyPath)
	case errors.Is(err, errNoKey):
	case err != nil:
		return nil, err
	default:
		if aead, err = newAEAD(key); err != nil {
			return nil, fmt.Errorf("loading secrets key: %w", err)
		}
	}
	s := &Store{db: opts.DB, keyPath: opts.KeyPath, max: opts.MaxSecrets, teamMax: opts.TeamMax, now: opts.Now, aead: aead}
	if s.max <= 0 {
		s.max = MaxSecrets
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// cipher returns the AEAD, loading the key file, or making it when create
// is set and no secret is stored (a missing key with secrets stored is
// lost, not replaced: their values could never open again, and a new key
// would hide that).
func (s *Store) cipher(ctx context.Context, create bool) (cipher.AEAD, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aead != nil {
		return s.aead, nil
	}
	key, err := readKey(s.keyPath)
	if errors.Is(err, errNoKey) && create {
		n, cerr := s.db.CountSecrets(ctx)
		if cerr != nil {
			return nil, fmt.Errorf("%w: %w", ErrBackend, cerr)
		}
		if n > 0 {
			return nil, fmt.Errorf("%w: secrets key %s is missing while %d secrets are stored", ErrBackend, s.keyPath, n)
		}
		if err = createKey(s.keyPath); err == nil {
			key, err = readKey(s.keyPath)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBackend, err)
	}
	aead, err := newAEAD(key)
	if err != nil {
		return nil, fmt.Errorf("%w: loading secrets key: %w", ErrBackend, err)
	}
	s.aead = aead
	return aead, nil
}

func checkValue(v string) error {
	if len(v) == 0 || len(v) > MaxValueBytes {
		return fmt.Errorf("a secret value has 1 to %d bytes: %w", MaxValueBytes, api.ErrInvalidArgument)
	}
	return nil
}

// CheckMetadata checks metadata against the limits.
func CheckMetadata(md map[string]string) error {
	if len(md) > MaxMetadataEntries {
		return fmt.Errorf("metadata has more than %d entries: %w", MaxMetadataEntries, api.ErrInvalidArgument)
	}
	total := 0
	for k, v := range md {
		if len(k) == 0 || len(k) > MaxMetadataKeyBytes {
			return fmt.Errorf("a metadata key has 1 to %d bytes: %w", MaxMetadataKeyBytes, api.ErrInvalidArgument)
		}
		if len(v) > MaxMetadataValueBytes {
			return fmt.Errorf("a metadata value has at most %d bytes: %w", MaxMetadataValueBytes, api.ErrInvalidArgument)
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("metadata is not valid UTF-8: %w", api.ErrInvalidArgument)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return fmt.Errorf("metadata has more than %d bytes: %w", MaxMetadataBytes, api.ErrInvalidArgument)
	}
	return nil
}

func info(r *store.Secret) *Secret {
	md := r.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return &Secret{ID: r.ID, Name: r.Name, Version: r.Version, Metadata: md, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt}
}

// Create stores a new secret at version 1.
func (s *Store) Create(ctx context.Context, name, value string, metadata map[string]string) (*Secret, error) {
	name, err := Name(name)
	if err != nil {
		return nil, err
	}
	if err := checkValue(value); err != nil {
		return nil, err
	}
	if err := CheckMetadata(metadata); err != nil {
		return nil, err
	}
	aead, err := s.cipher(ctx, true)
	if err != nil {
		return nil, err
	}
	now := s.now().UTC()
	id, err := newID(now)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBackend, err)
	}
	sealed, err := seal(aead, id, 1, value)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBackend, err)
	}
	if metadata == nil {
		metadata = map[string]string{}
	}
	rec := &store.Secret{ID: id, Name: name, Version: 1, Metadata: metadata, Sealed: sealed, CreatedAt: now, UpdatedAt: now}
	teamMax := 0
	if s.teamMax != nil {
		teamMax = s.teamMax(tenancy.TeamOf(ctx))
	}
	if err := s.db.InsertTeamSecret(ctx, rec, s.max, teamMax); err != nil {
		return nil, err
	}
	return info(rec), nil
}

// lookup returns the record a selector names.
func (s *Store) lookup(ctx context.Context, sel string) (*store.Secret, error) {
	p, err := parseSelector(sel)
	if err != nil {
		return nil, err
	}
	if p.id != "" {
		return s.db.SecretByID(ctx, p.id)
	}
	return s.db.SecretByName(ctx, p.name)
}

// Get returns the secret that sel names: an ID (sec_…) or a name, after
// trimming spaces and lower-casing.
func (s *Store) Get(ctx context.Context, sel string) (*Secret, error) {
	r, err := s.lookup(ctx, sel)
	if err != nil {
		return nil, err
	}
	return info(r), nil
}

// SecretID returns the ID of the secret sel names, for the team ctx acts
// for: a binding holds the ID, so that the gateway, which reads values
// for no team, swaps in that team's secret and never another's of the
// same name.
func (s *Store) SecretID(ctx context.Context, sel string) (string, error) {
	r, err := s.lookup(ctx, sel)
	if err != nil {
		return "", err
	}
	return r.ID, nil
}

// updateAttempts bounds the retries of an update that lost a race with
// another update of the same secret.
const updateAttempts = 5

// Update stores value as the next version of the secret sel names. A nil
// metadata keeps the secret's metadata; a non-nil one (even empty)
// replaces it.
func (s *Store) Update(ctx context.Context, sel, value string, metadata map[string]string) (*Secret, error) {
	if err := checkValue(value); err != nil {
		return nil, err
	}
	if err := CheckMetadata(metadata); err != nil {
		return nil, err
	}
	p, err := parseSelector(sel)
	if err != nil {
		return nil, err
	}
	aead, err := s.cipher(ctx, false)
	if err != nil {
		// No key means nothing is stored: the secret cannot exist.
		if _, lerr := s.lookup(ctx, sel); lerr != nil {
			return nil, lerr
		}
		return nil, err
	}
	s.updates.Lock()
	defer s.updates.Unlock()
	for range updateAttempts {
		var r *store.Secret
		if p.id != "" {
			r, err = s.db.SecretByID(ctx, p.id)
		} else {
			r, err = s.db.SecretByName(ctx, p.name)
		}
		if err != nil {
			return nil, err
		}
		sealed, err := seal(aead, r.ID, r.Version+1, value)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBackend, err)
		}
		now := s.now().UTC()
		err = s.db.UpdateSecret(ctx, r.ID, r.Version, sealed, metadata, now)
		if errors.Is(err, store.ErrSecretChanged) {
			continue
		}
		if err != nil {
			return nil, err
		}
		r.Version++
		r.UpdatedAt = now
		if metadata != nil {
			r.Metadata = metadata
		}
		return info(r), nil
	}
	return nil, fmt.Errorf("updating secret: %d concurrent updates won first: %w", updateAttempts, api.ErrConflict)
}

// Delete removes the secret sel names, all its versions with it.
func (s *Store) Delete(ctx context.Context, sel string) error {
	r, err := s.lookup(ctx, sel)
	if err != nil {
		return err
	}
	return s.db.DeleteSecret(ctx, r.ID)
}

// List returns up to limit secrets (1..100), newest first, from the page
// token a previous call returned ("" for the first page), and the token
// of the next page ("" on the last).
func (s *Store) List(ctx context.Context, limit int, token string) ([]*Secret, string, error) {
	if limit < 1 || limit > 100 {
		return nil, "", fmt.Errorf("limit must be from 1 to 100: %w", api.ErrInvalidArgument)
	}
	var after *store.SecretCursor
	if token != "" {
		c, err := parseToken(token)
		if err != nil {
			return nil, "", err
		}
		after = &c
	}
	recs, err := s.db.ListSecrets(ctx, after, limit+1)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(recs) > limit {
		recs = recs[:limit]
		last := recs[len(recs)-1]
		next = pageToken(store.SecretCursor{CreatedAt: last.CreatedAt, ID: last.ID})
	}
	out := make([]*Secret, 0, len(recs))
	for _, r := range recs {
		out = append(out, info(r))
	}
	return out, next, nil
}

// pageToken is base64url("<created unix ns>.<id>"): opaque to clients.
func pageToken(c store.SecretCursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.CreatedAt.UnixNano(), 10) + "." + c.ID))
}

func parseToken(tok string) (store.SecretCursor, error) {
	bad := fmt.Errorf("malformed page token: %w", api.ErrInvalidArgument)
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return store.SecretCursor{}, bad
	}
	ns, id, ok := strings.Cut(string(b), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || !validID(id) {
		return store.SecretCursor{}, bad
	}
	return store.SecretCursor{CreatedAt: time.Unix(0, n), ID: id}, nil
}

// Value returns the current value of the secret that name names (a name
// or an ID, by the selector rule). An unknown secret is an error wrapping
// api.ErrNotFound. It implements gateway.Secrets.
func (s *Store) Value(ctx context.Context, name string) (string, error) {
	r, err := s.lookup(ctx, name)
	if err != nil {
		return "", err
	}
	aead, err := s.cipher(ctx, false)
	if err != nil {
		return "", err
	}
	v, err := open(aead, r.ID, r.Version, r.Sealed)
	if err != nil {
		return "", fmt.Errorf("%w: secret %s version %d: %w", ErrBackend, r.ID, r.Version, err)
	}
	return v, nil
}

// sealedDataPrefix keeps what Seal makes apart from sealed secret values:
// neither opens as the other.
const sealedDataPrefix = "fence-data-v1\x00"

// Seal encrypts data that fence keeps in its database but must not hold
// in plaintext (a paused sandbox's environment), with the secrets key,
// bound to purpose: Unseal with the same purpose alone opens it. The key
// is made if there is none yet.
func (s *Store) Seal(ctx context.Context, purpose string, data []byte) ([]byte, error) {
	aead, err := s.cipher(ctx, true)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(data)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("generating nonce: %w", err)
	}
	return aead.Seal(nonce, nonce, data, []byte(sealedDataPrefix+purpose)), nil
}

// Unseal decrypts what Seal made for purpose.
func (s *Store) Unseal(ctx context.Context, purpose string, sealed []byte) ([]byte, error) {
	aead, err := s.cipher(ctx, false)
	if err != nil {
		return nil, err
	}
	n := aead.NonceSize()
	if len(sealed) < n+aead.Overhead() {
		return nil, errors.New("sealed data is truncated")
	}
	plain, err := aead.Open(nil, sealed[:n], sealed[n:], []byte(sealedDataPrefix+purpose))
	if err != nil {
		return nil, errors.New("sealed data does not open with this key for this purpose")
	}
	return plain, nil
}
