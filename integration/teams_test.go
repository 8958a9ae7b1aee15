package integration

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// TestTeamKeys makes a team and its API key with the CLI against a real
// daemon, creates and kills a sandbox with the key, finds the key still
// valid after a restart (only its hash is stored), and refuses it once
// it is revoked.
func TestTeamKeys(t *testing.T) {
	requireTemplate(t, "minimal")
	d := startDaemon(t, newDataDir(t), "--templates-dir", templatesDir(t))
	out, errs, code := d.fenceCLI(t, nil, "team", "create", "acme")
	team := strings.TrimSpace(out)
	if code != 0 || len(team) != 36 {
		t.Fatalf("fence team create = %d %q %q", code, out, errs)
	}
	out, errs, code = d.fenceCLI(t, nil, "key", "create", "ci", "--team", team, "--json")
	if code != 0 {
		t.Fatalf("fence key create = %d %q %q", code, out, errs)
	}
	var k api.CreatedTeamAPIKey
	if err := json.Unmarshal([]byte(out), &k); err != nil || !strings.HasPrefix(k.Key, "e2b_") {
		t.Fatalf("fence key create --json = %q (%v)", out, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := client.New(d.URL, k.Key)
	sb, err := c.Create(ctx, api.NewSandbox{TemplateID: "minimal"})
	if err != nil {
		t.Fatalf("Create with the team's key: %v", err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatalf("Kill with the team's key: %v", err)
	}

	d.Stop()
	d.Restart()
	c = client.New(d.URL, k.Key) // the new run listens on another port
	if _, err := c.List(ctx, client.ListOptions{}); err != nil {
		t.Fatalf("List with the team's key after a restart: %v", err)
	}
	if _, errs, code := d.fenceCLI(t, nil, "key", "revoke", k.ID, "--team", team); code != 0 {
		t.Fatalf("fence key revoke = %d %q", code, errs)
	}
	var ce *client.Error
	if _, err := c.List(ctx, client.ListOptions{}); !errors.As(err, &ce) || ce.Status != 401 {
		t.Fatalf("List with a revoked key = %v, want a 401", err)
	}
	if _, err := c.Create(ctx, api.NewSandbox{TemplateID: "minimal"}); !errors.As(err, &ce) || ce.Status != 401 {
		t.Fatalf("Create with a revoked key = %v, want a 401", err)
	}
}
