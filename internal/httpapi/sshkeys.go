package httpapi

import (
	"context"
	"crypto/rand"
	"net/http"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/store"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// SSHKeyStore keeps the public keys of the SSH server (*store.Store).
type SSHKeyStore interface {
	InsertSSHKey(ctx context.Context, k *store.SSHKey) error
	ListSSHKeys(ctx context.Context, team string) ([]store.SSHKey, error)
	DeleteSSHKey(ctx context.Context, team, id string) error
}

var _ SSHKeyStore = (*store.Store)(nil)

// SSHKeyRequest is the body of POST /ssh-keys.
type SSHKeyRequest struct {
	// PublicKey is one line of authorized_keys: "ssh-ed25519 AAAA… comment".
	PublicKey string `json:"publicKey"`
	// Name labels the key; the key's comment when empty.
	Name string `json:"name,omitempty"`
}

// SSHKey is a registered key as the API shows it.
type SSHKey struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	PublicKey   string    `json:"publicKey"`
	Fingerprint string    `json:"fingerprint"`
	CreatedAt   time.Time `json:"createdAt"`
}

// maxSSHKeyName bounds a key's name.
const maxSSHKeyName = 200

// teamOf is the team a request acts for: its principal's, or the default
// team's for a deployment without teams.
func teamOf(r *http.Request) string {
	if p, ok := tenancy.FromContext(r.Context()); ok {
		return p.Team
	}
	return tenancy.DefaultTeamID
}

func (h *handler) sshKeysOr(w http.ResponseWriter, r *http.Request) (SSHKeyStore, bool) {
	if h.sshKeys == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "this daemon keeps no SSH keys"))
		return nil, false
	}
	return h.sshKeys, true
}

// createSSHKey is POST /ssh-keys: registers a public key for `ssh`.
func (h *handler) createSSHKey(w http.ResponseWriter, r *http.Request) {
	st, ok := h.sshKeysOr(w, r)
	if !ok {
		return
	}
	var req SSHKeyRequest
	if err := decodeJSON(r, &req, false); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	pub, comment, _, rest, err := ssh.ParseAuthorizedKey([]byte(req.PublicKey))
	if err != nil || strings.TrimSpace(string(rest)) != "" {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "publicKey must be one authorized_keys line"))
		return
	}
	name := req.Name
	if name == "" {
		name = comment
	}
	if len(name) > maxSSHKeyName {
		writeError(w, r, h.log, errorf(api.ErrInvalidArgument, "name is longer than %d bytes", maxSSHKeyName))
		return
	}
	k := &store.SSHKey{ID: "sshkey_" + strings.ToLower(rand.Text()), Team: teamOf(r), Name: name,
		PublicKey:   strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))),
		Fingerprint: ssh.FingerprintSHA256(pub), CreatedAt: h.now().UTC()}
	if err := st.InsertSSHKey(r.Context(), k); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, sshKeyOut(*k))
}

// listSSHKeys is GET /ssh-keys: the team's keys.
func (h *handler) listSSHKeys(w http.ResponseWriter, r *http.Request) {
	st, ok := h.sshKeysOr(w, r)
	if !ok {
		return
	}
	keys, err := st.ListSSHKeys(r.Context(), teamOf(r))
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make([]SSHKey, len(keys))
	for i, k := range keys {
		out[i] = sshKeyOut(k)
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSSHKey is DELETE /ssh-keys/{id}.
func (h *handler) deleteSSHKey(w http.ResponseWriter, r *http.Request) {
	st, ok := h.sshKeysOr(w, r)
	if !ok {
		return
	}
	if err := st.DeleteSSHKey(r.Context(), teamOf(r), r.PathValue("id")); err != nil {
		writeError(w, r, h.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func sshKeyOut(k store.SSHKey) SSHKey {
	return SSHKey{ID: k.ID, Name: k.Name, PublicKey: k.PublicKey, Fingerprint: k.Fingerprint, CreatedAt: k.CreatedAt}
}
