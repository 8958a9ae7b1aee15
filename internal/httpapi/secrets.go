package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/downloads"
	"github.com/fencesandbox/fence/internal/secrets"
)

// SecretStore is the part of *secrets.Store the API uses.
type SecretStore interface {
	Create(ctx context.Context, name, value string, metadata map[string]string) (*secrets.Secret, error)
	List(ctx context.Context, limit int, token string) ([]*secrets.Secret, string, error)
	Get(ctx context.Context, sel string) (*secrets.Secret, error)
	Update(ctx context.Context, sel, value string, metadata map[string]string) (*secrets.Secret, error)
	Delete(ctx context.Context, sel string) error
}

var _ SecretStore = (*secrets.Store)(nil)

// DownloadLog is the part of *downloads.Log the API uses.
type DownloadLog interface {
	List(ctx context.Context, sandboxID string) ([]downloads.Download, error)
}

var _ DownloadLog = (*downloads.Log)(nil)

// isSecretsPath reports whether a path is under /secrets, whose responses
// are never cached and whose errors have fixed messages.
func isSecretsPath(p string) bool {
	return p == "/secrets" || strings.HasPrefix(p, "/secrets/")
}

// secretsError turns any error of a /secrets route into one of the fixed
// answers, so no input (a name, a value, a byte of the body) is ever
// echoed: 400, 404, 409, 504 or else 502.
func secretsError(err error) error {
	var sentinel error
	msg := api.SecretMsgBackend
	switch {
	case errors.Is(err, api.ErrInvalidArgument), errors.Is(err, errTooLarge):
		sentinel, msg = api.ErrInvalidArgument, api.SecretMsgInvalid
	case errors.Is(err, api.ErrNotFound), errors.Is(err, errNoRoute):
		sentinel, msg = api.ErrNotFound, api.SecretMsgNotFound
	case errors.Is(err, api.ErrConflict):
		sentinel, msg = api.ErrConflict, api.SecretMsgConflict
	case errors.Is(err, api.ErrResourceExhausted): // the team's limit: E2B's 429
		sentinel, msg = api.ErrResourceExhausted, strings.TrimSuffix(err.Error(), ": "+api.ErrResourceExhausted.Error())
	case errors.Is(err, errMethodNotAllowed):
		sentinel, msg = errMethodNotAllowed, "Method not allowed"
	case errors.Is(err, errUnauthenticated):
		sentinel, msg = errUnauthenticated, "You are not authenticated"
	case errors.Is(err, context.DeadlineExceeded):
		sentinel, msg = context.DeadlineExceeded, api.SecretMsgTimeout
	default:
		sentinel = errBadGateway
	}
	return &publicError{msg: msg, sentinel: sentinel, cause: err}
}

func toAPISecret(s *secrets.Secret) api.Secret {
	md := s.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return api.Secret{SecretID: s.ID, Name: s.Name, CurrentVersion: s.Version, Metadata: md,
		CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// secretsOr returns the secret store, or the error that tells it is
// missing from this handler.
func (h *handler) secretsOr() (SecretStore, error) {
	if h.secrets == nil {
		return nil, errors.New("no secret store configured")
	}
	return h.secrets, nil
}

func (h *handler) secretFail(w http.ResponseWriter, r *http.Request, err error) {
	writeError(w, r, h.log, secretsError(err))
}

// secretsBody opens a handler that writes a secret: the secret store, and
// the request body decoded into req.
func (h *handler) secretsBody(r *http.Request, req any) (SecretStore, error) {
	st, err := h.secretsOr()
	if err != nil {
		return nil, err
	}
	if err := decodeJSON(r, req, false); err != nil {
		return nil, err
	}
	return st, nil
}

func (h *handler) createSecret(w http.ResponseWriter, r *http.Request) {
	var req api.NewSecret
	st, err := h.secretsBody(r, &req)
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	if req.Value == nil {
		h.secretFail(w, r, errorf(api.ErrInvalidArgument, "no value"))
		return
	}
	s, err := st.Create(r.Context(), req.Name, *req.Value, req.Metadata)
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toAPISecret(s))
}

func (h *handler) listSecrets(w http.ResponseWriter, r *http.Request) {
	st, err := h.secretsOr()
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	q := r.URL.Query()
	limit := defaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			h.secretFail(w, r, errorf(api.ErrInvalidArgument, "bad limit"))
			return
		}
		limit = n
	}
	list, next, err := st.List(r.Context(), limit, q.Get("nextToken"))
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	out := make([]api.Secret, 0, len(list))
	for _, s := range list {
		out = append(out, toAPISecret(s))
	}
	if next != "" {
		w.Header().Set(api.HeaderNextToken, next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) getSecret(w http.ResponseWriter, r *http.Request) {
	st, err := h.secretsOr()
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	s, err := st.Get(r.Context(), r.PathValue("secretID"))
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISecret(s))
}

func (h *handler) updateSecret(w http.ResponseWriter, r *http.Request) {
	var req api.SecretUpdate
	st, err := h.secretsBody(r, &req)
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	if req.Value == nil {
		h.secretFail(w, r, errorf(api.ErrInvalidArgument, "no value"))
		return
	}
	s, err := st.Update(r.Context(), r.PathValue("secretID"), *req.Value, req.Metadata)
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toAPISecret(s))
}

func (h *handler) deleteSecret(w http.ResponseWriter, r *http.Request) {
	st, err := h.secretsOr()
	if err != nil {
		h.secretFail(w, r, err)
		return
	}
	if err := st.Delete(r.Context(), r.PathValue("secretID")); err != nil {
		h.secretFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sandboxDownloads is GET /sandboxes/{id}/downloads: the package artifacts
// the sandbox fetched, oldest first; kept after the sandbox is killed.
func (h *handler) sandboxDownloads(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	if h.downloads == nil {
		writeError(w, r, h.log, errorf(api.ErrUnimplemented, "download records are not kept by this daemon"))
		return
	}
	list, err := h.downloads.List(r.Context(), id)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	out := make([]api.Download, 0, len(list))
	for _, d := range list {
		out = append(out, api.Download{Ecosystem: d.Ecosystem, Name: d.Name, Version: d.Version, URL: d.URL,
			Size: d.Size, SHA256: d.SHA256, Time: d.Time})
	}
	writeJSON(w, http.StatusOK, out)
}
