package httpapi

import (
	"net/http"

	"github.com/fencesandbox/fence/api"
)

// registerPrincipal serves GET /principal: the caller's team, key ID and
// whether it is the admin, for any credential the API takes. It tells the
// caller only of itself.
func (h *handler) registerPrincipal(mux *http.ServeMux) {
	mux.HandleFunc("GET /principal", func(w http.ResponseWriter, r *http.Request) {
		c := callerFrom(r.Context())
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, http.StatusOK, api.Principal{Team: c.p.Team, KeyID: c.p.KeyID, Admin: c.p.Admin})
	})
}
