package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/agent/process"
	"github.com/fencesandbox/fence/internal/agent/users"
)

func TestReadServicesRejectsBadFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if s, err := readServices(filepath.Join(dir, "missing.json")); err != nil || s != nil {
		t.Errorf("missing file: %v, %v; want no services, no error", s, err)
	}
	many := `{"services":[` + strings.Repeat(`{"argv":["true"]},`, maxServices) + `{"argv":["true"]}]}`
	for name, content := range map[string]string{
		"notjson":  "{",
		"noargv":   `{"services":[{"name":"x"}]}`,
		"emptyarg": `{"services":[{"name":"x","argv":[""]}]}`,
		"many":     many,
		"huge":     `{"services":[],"pad":"` + strings.Repeat("x", maxServicesFile) + `"}`,
	} {
		if s, err := readServices(write(name, content)); err == nil {
			t.Errorf("%s: got %v, want an error", name, s)
		}
	}
	// A symlink is not followed (the file is the template's, in place).
	target := write("real.json", `{"services":[{"argv":["true"]}]}`)
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if s, err := readServices(link); err == nil {
		t.Errorf("symlink: got %v, want an error", s)
	}
}

// TestServicesStartAndRestart: a declared service starts with the agent,
// is restarted when it exits, and is killed when the agent stops.
func TestServicesStartAndRestart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("agent tests must run as root")
	}
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	alive := filepath.Join(dir, "alive")
	// The first two runs exit at once; the third stays up.
	script := `echo $$ >> ` + runs + `; n=$(wc -l < ` + runs + `); if [ "$n" -lt 3 ]; then exit 1; fi; echo $$ > ` + alive + `; exec sleep 600`
	cfg := `{"services":[{"name":"t","argv":["/bin/sh","-c",` + quoteJSON(script) + `],"user":"root","dir":"` + dir + `"}]}`
	file := filepath.Join(dir, "services.json")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	resolver := &users.Resolver{}
	procs := process.NewService(process.Options{Users: resolver})
	defer procs.Close()
	ctx, cancel := context.WithCancel(t.Context())
	runServices(ctx, file, procs, resolver, logger(Options{}))

	var pid string
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(alive)
		if err == nil && len(b) > 0 {
			pid = strings.TrimSpace(string(b))
			break
		}
		if time.Now().After(deadline) {
			cancel()
			b, _ := os.ReadFile(runs)
			t.Fatalf("service not running after restarts; runs:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat("/proc/" + pid); err != nil {
		t.Fatalf("service pid %s not running: %v", pid, err)
	}
	cancel()
	deadline = time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("service pid %s still running after the agent stopped", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func quoteJSON(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}
