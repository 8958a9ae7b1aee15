package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/fencesandbox/fence/internal/audit"
	"github.com/fencesandbox/fence/internal/store"
)

// TestAuditVerify: GET /audit/verify reports the verifier's findings, an
// intact chain or its first break, to the daemon's key alone.
func TestAuditVerify(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	team, err := st.CreateTeam(t.Context(), "other")
	if err != nil {
		t.Fatal(err)
	}
	teamKey, _, err := st.MintAPIKey(t.Context(), team.ID, "k")
	if err != nil {
		t.Fatal(err)
	}
	rep := audit.Report{Records: 9, FirstSeq: 1, LastSeq: 9, Segments: 1, Checkpoints: 2, LastCheckpoint: 7, Unsigned: 2}
	var verr error
	get := func(t *testing.T, v AuditVerifier, key string) (int, auditVerification) {
		t.Helper()
		srv := httptest.NewServer(New(Options{APIKey: testKey, Identity: st, AuditVerify: v}))
		defer srv.Close()
		req, _ := http.NewRequest("GET", srv.URL+"/audit/verify", nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var out auditVerification
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
		}
		return resp.StatusCode, out
	}
	verify := func(context.Context) (audit.Report, error) { return rep, verr }

	if st, out := get(t, verify, testKey); st != http.StatusOK || !out.Intact || out.LastCheckpoint != 7 || out.Unsigned != 2 || out.Records != 9 || out.Break != nil {
		t.Errorf("intact: %d %+v", st, out)
	}
	if st, _ := get(t, verify, teamKey); st != http.StatusUnauthorized {
		t.Errorf("a team's key = %d, want 401", st)
	}
	if st, _ := get(t, nil, testKey); st != http.StatusNotImplemented {
		t.Errorf("no verifier = %d, want 501", st)
	}
	brk := &audit.Break{Segment: "000001.jsonl", Line: 4, Seq: 4, Reason: "prev does not match"}
	rep.Break, verr = brk, brk
	if st, out := get(t, verify, testKey); st != http.StatusOK || out.Intact || out.Break == nil || out.Break.Seq != 4 || out.Break.Reason != brk.Reason {
		t.Errorf("broken: %d %+v", st, out)
	}
}
