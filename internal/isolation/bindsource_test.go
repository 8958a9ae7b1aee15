package isolation

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckBindSource(t *testing.T) {
	data := t.TempDir()
	tmpl := filepath.Join(t.TempDir(), "templates") // need not exist
	tests := []struct {
		host     string
		readOnly bool
		why      string // "" means allowed
	}{
		// Projects, whoever owns them: a root user's included.
		{host: "/root/proj"},
		{host: "/root/proj/.git"},
		{host: "/home/alice/src/app"},
		{host: "/srv/www/site"},
		{host: "/opt/app"},
		{host: "/tmp/x"},
		{host: "/var/www/site"},
		{host: "/var/tmp/build"},
		{host: "/workspace"},
		// Read-only views of system places.
		{host: "/etc", readOnly: true},
		{host: "/usr/share/doc", readOnly: true},
		{host: "/root", readOnly: true},
		{host: "/root/.ssh", readOnly: true},
		{host: "/home", readOnly: true},
		{host: "/home/alice", readOnly: true},
		// Never.
		{host: "/", why: "host's root"},
		{host: "/", readOnly: true, why: "host's root"},
		{host: "/proc/1", readOnly: true, why: "inside /proc"},
		{host: "/sys", readOnly: true, why: "kernel"},
		{host: "/dev/shm", why: "inside /dev"},
		{host: "/run/docker.sock", readOnly: true, why: "daemon sockets"},
		{host: "/var/lib/fence", readOnly: true, why: "fence's directory"},
		{host: "/var/lib/fence/api-key", readOnly: true, why: "fence's directory"},
		{host: "/var/lib", readOnly: true, why: "contains fence's directory"},
		{host: "/var", readOnly: true, why: "contains"},
		{host: data, readOnly: true, why: "fence's directory"},
		{host: filepath.Join(data, "native", "x"), why: "inside fence's directory"},
		{host: filepath.Dir(data), readOnly: true, why: "contains fence's directory"},
		{host: tmpl, readOnly: true, why: "fence's directory"},
		// Not writable.
		{host: "/etc", why: "host's configuration"},
		{host: "/etc/ssh", why: "inside /etc"},
		{host: "/usr", why: "programs"},
		{host: "/usr/local/bin", why: "inside /usr"},
		{host: "/boot", why: "boot loader"},
		{host: "/var/spool/cron", why: "cron"},
		{host: "/root", why: "root's home"},
		{host: "/root/.ssh", why: "hidden entry of the home /root"},
		{host: "/root/.config/x", why: "hidden entry"},
		{host: "/home", why: "every user's home"},
		{host: "/home/alice", why: "a home directory"},
		{host: "/home/alice/.bashrc", why: "hidden entry of the home /home/alice"},
		{host: "/tmp", why: "/tmp"},
		{host: "/var/tmp", why: "temporary directory"},
		{host: "/opt", why: "installed programs"},
		{host: "relative", why: "clean absolute"},
		{host: "/root/../etc", why: "clean absolute"},
	}
	for _, tt := range tests {
		err := CheckBindSource(tt.host, tt.readOnly, data, tmpl)
		switch {
		case tt.why == "" && err != nil:
			t.Errorf("CheckBindSource(%q, readOnly %v) = %v, want nil", tt.host, tt.readOnly, err)
		case tt.why != "" && (!errors.Is(err, ErrBindRefused) || !strings.Contains(err.Error(), tt.why)):
			t.Errorf("CheckBindSource(%q, readOnly %v) = %v, want ErrBindRefused naming %q", tt.host, tt.readOnly, err, tt.why)
		}
	}
}
