package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// sshPassword runs `ssh target echo by-password` with password pw (by
// SSH_ASKPASS, as a script without a terminal would) and reports whether
// the command ran.
func (s *sshDaemon) sshPassword(t *testing.T, pw, target string) bool {
	t.Helper()
	askpass := filepath.Join(s.dir, "askpass")
	if err := os.WriteFile(askpass, []byte("#!/bin/sh\necho '"+pw+"'\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", "-o", "UserKnownHostsFile="+s.hosts, "-o", "StrictHostKeyChecking=yes",
		"-o", "PubkeyAuthentication=no", "-o", "NumberOfPasswordPrompts=1", "-o", "LogLevel=ERROR",
		"-p", s.port, target+"@127.0.0.1", "echo by-password")
	cmd.Env = append(os.Environ(), "SSH_ASKPASS="+askpass, "SSH_ASKPASS_REQUIRE=force", "DISPLAY=none")
	out, _ := cmd.Output()
	return string(out) == "by-password\n"
}

// TestSSHTeamAPIKeyPassword: a team's API key is an SSH password that
// reaches its team's sandboxes alone; another team's key, a revoked key
// and an auditor key are refused. Root: namespaces.
func TestSSHTeamAPIKeyPassword(t *testing.T) {
	requireTemplate(t, "minimal")
	s := startSSHDaemon(t)
	r := s.do(t, "POST", "/admin/teams", s.Key, strings.NewReader(`{"name":"team-b"}`), nil)
	var team api.TeamInfo
	if r.Status != 201 || json.Unmarshal(r.Body, &team) != nil {
		t.Fatalf("POST /admin/teams = %d %s", r.Status, r.Body)
	}
	mint := func(path, body string) api.CreatedTeamAPIKey {
		t.Helper()
		r := s.do(t, "POST", path, s.Key, strings.NewReader(body), nil)
		var k api.CreatedTeamAPIKey
		if r.Status != 201 || json.Unmarshal(r.Body, &k) != nil {
			t.Fatalf("POST %s = %d %s", path, r.Status, r.Body)
		}
		return k
	}
	keyA := mint("/api-keys", `{"name":"ssh-a"}`)
	auditor := mint("/api-keys", `{"name":"aud","role":"auditor"}`)
	keyB := mint("/admin/teams/"+team.TeamID+"/api-keys", `{"name":"ssh-b"}`)

	sbA := s.create(t, api.NewSandbox{TemplateID: "minimal"})
	r = s.do(t, "POST", "/sandboxes", keyB.Key, strings.NewReader(`{"templateID":"minimal","timeout":300}`), nil)
	var sbB api.Sandbox
	if r.Status != 201 || json.Unmarshal(r.Body, &sbB) != nil {
		t.Fatalf("team b's create = %d %s", r.Status, r.Body)
	}
	t.Cleanup(func() { s.do(t, "DELETE", "/sandboxes/"+sbB.SandboxID, keyB.Key, nil, nil) })

	for _, c := range []struct {
		name, pw, target string
		want             bool
	}{
		{"team a's key, its sandbox", keyA.Key, sbA.ID(), true},
		{"team b's key, its sandbox", keyB.Key, sbB.SandboxID, true},
		{"team a's key, team b's sandbox", keyA.Key, sbB.SandboxID, false},
		{"team b's key, team a's sandbox", keyB.Key, sbA.ID(), false},
		{"an auditor key", auditor.Key, sbA.ID(), false},
		{"a key that never existed", "e2b_" + strings.Repeat("0", 64), sbA.ID(), false},
	} {
		if got := s.sshPassword(t, c.pw, c.target); got != c.want {
			t.Errorf("%s: ran %v, want %v", c.name, got, c.want)
		}
	}
	if r := s.do(t, "DELETE", "/api-keys/"+keyA.ID, s.Key, nil, nil); r.Status != 204 {
		t.Fatalf("revoking team a's key = %d %s", r.Status, r.Body)
	}
	if s.sshPassword(t, keyA.Key, sbA.ID()) {
		t.Error("a revoked key still opens a session")
	}
	if !s.sshPassword(t, s.Key, sbA.ID()) {
		t.Error("the daemon's key no longer opens a session")
	}
}
