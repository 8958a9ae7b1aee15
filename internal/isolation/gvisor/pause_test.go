package gvisor_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/internal/isolation"
	"github.com/fencesandbox/fence/internal/isolation/isolationtest"
	"github.com/fencesandbox/fence/internal/testutil"
)

// workFiles writes the programs TestPauseKeepsWorkGoing starts: timers of
// each kind (a shell's sleep, node's setTimeout, Python's time.sleep), a
// grandchild, and a TCP connection held open inside the sandbox, each
// writing its marker in /tmp/out once its three seconds are up.
const workFiles = `mkdir -p /tmp/out /tmp/work && cd /tmp/work &&
cat > timer.py <<'END'
import time
time.sleep(3)
open("/tmp/out/python", "w").write("done")
END
cat > timer.js <<'END'
setTimeout(() => require("fs").writeFileSync("/tmp/out/node", "done"), 3000)
END
cat > server.py <<'END'
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7000))
s.listen()
def echo(c):
    while True:
        d = c.recv(64)
        if not d:
            return
        c.sendall(d)
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
END
cat > client.py <<'END'
import socket, sys, time
for _ in range(200):
    try:
        c = socket.create_connection(("127.0.0.1", 7000))
        break
    except OSError:
        time.sleep(0.05)
c.sendall(b"d")
got = c.recv(1)
time.sleep(float(sys.argv[1]))
c.sendall(b"one")
while len(got) < 4:
    got += c.recv(4)
open(sys.argv[2], "w").write(got.decode())
END
`

// startWork is a user's command (E2B runs commands with bash -l -c): it
// starts everything in the background and returns.
const startWork = `cd /tmp/work
(sleep 3 && echo -n done > /tmp/out/sleep) </dev/null >/dev/null 2>&1 &
python3 timer.py </dev/null >/dev/null 2>&1 &
node timer.js </dev/null >/dev/null 2>&1 &
sh -c 'sh -c "sleep 3; echo -n done > /tmp/out/grandchild" &' </dev/null >/dev/null 2>&1 &
python3 server.py </dev/null >/dev/null 2>&1 &
python3 client.py 3 /tmp/out/tcp </dev/null >/dev/null 2>&1 &
`

// TestPauseKeepsWorkGoing pauses a sandbox right after a command started
// its work, as E2B's SDK tests do, for longer than the work's timers:
// each timer counts through the pause on the wall clock, as on native's
// frozen cgroup, so its marker is there right after the resume; a TCP
// connection inside the sandbox carries on, and its server takes new
// connections.
func TestPauseKeepsWorkGoing(t *testing.T) {
	testutil.RequireRunsc(t)
	rootfs := testutil.RootFS(t, "base")
	b := stateFactory(t)(t)
	s, err := b.Create(t.Context(), isolation.Spec{RootFS: rootfs})
	if err != nil {
		t.Fatalf("Create() = %v", err)
	}
	t.Cleanup(func() { s.Kill(t.Context()) })
	sh := func(script string) string {
		t.Helper()
		out, code, err := isolationtest.Exec(t.Context(), s, "/bin/bash", "-l", "-c", script)
		if err != nil || code != 0 {
			t.Fatalf("exec = %q, exit %d, %v", out, code, err)
		}
		return out
	}
	sh(workFiles)
	sh(startWork)
	p := s.(isolation.Pauser)
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	// Paused for longer than the timers' three seconds: each is due at
	// the resume. Work that began only after the resume would take its
	// three seconds from there.
	time.Sleep(5 * time.Second)
	if err := p.Resume(t.Context()); err != nil {
		t.Fatalf("Resume() = %v", err)
	}
	resumed := time.Now()
	want := map[string]string{"sleep": "done", "python": "done", "node": "done", "grandchild": "done", "tcp": "done"}
	var got map[string]string
	for {
		got = map[string]string{}
		for name := range want {
			out, _, err := isolationtest.Exec(t.Context(), s, "cat", "/tmp/out/"+name)
			if err != nil {
				t.Fatalf("reading %s: %v", name, err)
			}
			got[name] = out
		}
		if equal(got, want) || time.Since(resumed) > 1500*time.Millisecond {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("/tmp/out/%s %v after the resume = %q, want %q: its work did not run on through the pause",
				name, time.Since(resumed).Round(time.Millisecond), got[name], w)
		}
	}
	// The server in the sandbox takes a new connection after the resume.
	if out := sh("python3 /tmp/work/client.py 0 /dev/stdout"); !strings.HasPrefix(out, "done") {
		t.Errorf("a new connection to the sandbox's server after the resume = %q, want done", out)
	}
}

func equal(a, b map[string]string) bool {
	for k, v := range b {
		if a[k] != v {
			return false
		}
	}
	return true
}
