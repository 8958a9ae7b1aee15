package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/internal/tenancy"
)

// concurrently sends n requests at once, the i-th made by req(i), and
// returns how many were answered 2xx and the other answers.
func concurrently(t *testing.T, n int, req func(i int) rawResponse) (ok int, refused []rawResponse) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := req(i)
			mu.Lock()
			defer mu.Unlock()
			if r.Status/100 == 2 {
				ok++
			} else {
				refused = append(refused, r)
			}
		})
	}
	wg.Wait()
	return ok, refused
}

// TestTeamKeptQuotas: a team's limits of secrets, snapshots and their
// disk hold under concurrent creates: exactly the limit is made, the
// others are answered E2B's 429, and nothing of theirs is kept.
// Root: namespaces, layers.
func TestTeamKeptQuotas(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t))
	if r := d.putTeamLimits(t, tenancy.DefaultTeamID, `{"secrets":3,"snapshots":2}`); r.Status != http.StatusOK {
		t.Fatalf("PUT limits = %d %s", r.Status, r.Body)
	}
	wantRefused := func(refused []rawResponse, msg string) {
		t.Helper()
		for _, r := range refused {
			wantE2BError(t, r, http.StatusTooManyRequests, msg)
		}
	}

	ok, refused := concurrently(t, 8, func(i int) rawResponse {
		return d.do(t, "POST", "/secrets", d.Key, strings.NewReader(fmt.Sprintf(`{"name":"s%d","value":"v-%d"}`, i, i)), nil)
	})
	if ok != 3 || len(refused) != 5 {
		t.Fatalf("8 secrets against a limit of 3: %d made, %d refused", ok, len(refused))
	}
	wantRefused(refused, "you have reached the maximum number of secrets (3)")
	var secrets []json.RawMessage
	if r := d.do(t, "GET", "/secrets", d.Key, nil, nil); r.Status != 200 || json.Unmarshal(r.Body, &secrets) != nil || len(secrets) != 3 {
		t.Fatalf("GET /secrets = %d %s, want 3", r.Status, r.Body)
	}

	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	rsh(t, sb.Envd(), `head -c 1048576 /dev/urandom > /big && sync`)
	snapshots := func() int {
		t.Helper()
		var list []api.SnapshotInfo
		if r := d.do(t, "GET", "/snapshots", d.Key, nil, nil); r.Status != 200 || json.Unmarshal(r.Body, &list) != nil {
			t.Fatalf("GET /snapshots = %d %s", r.Status, r.Body)
		}
		return len(list)
	}
	ok, refused = concurrently(t, 5, func(int) rawResponse {
		return d.do(t, "POST", "/sandboxes/"+sb.ID()+"/snapshots", d.Key, strings.NewReader(`{}`), nil)
	})
	if ok != 2 || len(refused) != 3 {
		t.Fatalf("5 snapshots against a limit of 2: %d made, %d refused", ok, len(refused))
	}
	wantRefused(refused, "you have reached the maximum number of snapshots (2)")
	if n := snapshots(); n != 2 {
		t.Fatalf("%d snapshots kept, want 2", n)
	}

	// Their disk: a limit of one byte refuses the next snapshot, whose
	// layer holds a MiB, and keeps none of it.
	if r := d.putTeamLimits(t, tenancy.DefaultTeamID, `{"snapshots":0,"snapshotBytes":1}`); r.Status != http.StatusOK {
		t.Fatalf("PUT limits = %d %s", r.Status, r.Body)
	}
	r := d.do(t, "POST", "/sandboxes/"+sb.ID()+"/snapshots", d.Key, strings.NewReader(`{"name":"too-big"}`), nil)
	wantE2BError(t, r, http.StatusTooManyRequests, "you have reached the maximum disk of snapshots (1 bytes)")
	if n := snapshots(); n != 2 {
		t.Fatalf("%d snapshots kept after a refused one, want 2", n)
	}
	if r := d.do(t, "GET", "/snapshots?name=too-big", d.Key, nil, nil); r.Status != 200 || strings.Contains(string(r.Body), "too-big") {
		t.Fatalf("the refused snapshot is listed: %d %s", r.Status, r.Body)
	}

	// No limit: the next one is made.
	if r := d.putTeamLimits(t, tenancy.DefaultTeamID, `{"snapshotBytes":0}`); r.Status != http.StatusOK {
		t.Fatalf("PUT limits = %d %s", r.Status, r.Body)
	}
	if r := d.do(t, "POST", "/sandboxes/"+sb.ID()+"/snapshots", d.Key, strings.NewReader(`{}`), nil); r.Status/100 != 2 {
		t.Fatalf("snapshot without limits = %d %s", r.Status, r.Body)
	}
}
