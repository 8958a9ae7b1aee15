package httpapi

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// TestPrincipal: GET /principal names the caller's team and key, and
// needs a credential.
func TestPrincipal(t *testing.T) {
	e := newUIEnv(t, false)
	resp, b := e.req(t, "GET", "/principal", "", map[string]string{"X-API-Key": testKey})
	var p api.Principal
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(b), &p) != nil {
		t.Fatalf("GET /principal = %d %s", resp.StatusCode, b)
	}
	if p != (api.Principal{Team: tenancy.DefaultTeamID, KeyID: tenancy.BootstrapKeyID, Admin: true}) {
		t.Errorf("GET /principal of the daemon's key = %+v", p)
	}
	if resp, b := e.req(t, "GET", "/principal", "", map[string]string{"X-API-Key": "e2b_wrong"}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /principal with a wrong key = %d %s, want 401", resp.StatusCode, b)
	}
}
