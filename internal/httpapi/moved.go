package httpapi

import (
	"context"
	"net/http"
	"strings"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// Locator tells where a sandbox moved off its node (a drained one) went;
// *snapreg.Store implements it.
type Locator interface {
	// Locate returns the node that took moved sandbox id over ("" while
	// it waits in the registry), or an error wrapping api.ErrNotFound for
	// an ID never moved or another team's.
	Locate(ctx context.Context, id string) (node string, err error)
}

// registerMoves adds GET /moved-sandboxes/{id} when sandboxes move
// between nodes (Options.Moves). Its path does not name a live sandbox
// (the ownership gate's /sandboxes/{id}): the moved record's team is
// checked by Locate.
func (h *handler) registerMoves(mux *http.ServeMux) {
	if h.moves == nil {
		return
	}
	mux.HandleFunc("GET /moved-sandboxes/{id}", h.sandboxLocation)
}

// movedHere reports whether a connect or resume names a sandbox of the
// caller's team moved off its node: the ownership gate lets it through
// to the pauses, which take the sandbox over (snapreg.Arriving).
func (h *handler) movedHere(r *http.Request, pattern, id string) bool {
	if h.moves == nil || r.Method != http.MethodPost ||
		!strings.HasSuffix(pattern, "/connect") && !strings.HasSuffix(pattern, "/resume") {
		return false
	}
	_, err := h.moves.Locate(r.Context(), id)
	return err == nil
}

// sandboxLocation is GET /moved-sandboxes/{id}: api.SandboxLocation,
// for the caller's team (another team's sandbox is not found), or for
// every team with the admin key.
func (h *handler) sandboxLocation(w http.ResponseWriter, r *http.Request) {
	id, err := sandboxID(r)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	ctx := r.Context()
	if callerFrom(ctx).p.Admin {
		// The admin key (a router's, for a moved sandbox's traffic,
		// which carries no API key) locates every team's sandboxes.
		ctx = tenancy.NewContext(ctx, tenancy.Principal{})
	}
	node, err := h.moves.Locate(ctx, id)
	if err != nil {
		writeError(w, r, h.log, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SandboxLocation{SandboxID: id, Node: node, Waiting: node == ""})
}
