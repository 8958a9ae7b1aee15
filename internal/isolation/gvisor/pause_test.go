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
// each kind (node's setTimeout, Python's time.sleep, a shell's sleep in a
// grandchild), and a TCP connection held open inside the sandbox, each
// writing NAME.ready in /tmp/out once its timer is armed and NAME once
// its three seconds are up.
const workFiles = `mkdir -p /tmp/out /tmp/work && cd /tmp/work &&
cat > timer.py <<'END'
import time
open("/tmp/out/python.ready", "w").write("")
time.sleep(3)
open("/tmp/out/python", "w").write("done")
END
cat > timer.js <<'END'
setTimeout(() => require("fs").writeFileSync("/tmp/out/node", "done"), 3000)
require("fs").writeFileSync("/tmp/out/node.ready", "")
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
open(sys.argv[2] + ".ready", "w").write("")
time.sleep(float(sys.argv[1]))
c.sendall(b"one")
while len(got) < 4:
    got += c.recv(4)
open(sys.argv[2], "w").write(got.decode())
END
`

// startWork starts the work of workFiles in the background.
const startWork = `cd /tmp/work
python3 timer.py </dev/null >/dev/null 2>&1 &
node timer.js </dev/null >/dev/null 2>&1 &
sh -c 'sh -c "touch /tmp/out/grandchild.ready; sleep 3; echo -n done > /tmp/out/grandchild" &' </dev/null >/dev/null 2>&1 &
python3 server.py </dev/null >/dev/null 2>&1 &
python3 client.py 3 /tmp/out/tcp </dev/null >/dev/null 2>&1 &
`

// startCommand is a command as E2B's SDK starts one (bash -l -c, in the
// background), which the pause follows at once.
const startCommand = `(bash -l -c 'sleep 3 && echo -n done > /tmp/out/sleep') </dev/null >/dev/null 2>&1 &`

// TestPauseKeepsWorkGoing pauses a sandbox for longer than the timers of
// its work: timers armed before the pause (node, Python, a grandchild's
// sleep) count through it on the wall clock, gVisor's clocks running on
// through a checkpoint, so their markers are there right after the
// resume; a TCP connection inside the sandbox carries on, and its server
// takes new connections. A command started just before the pause, as
// E2B's SDK tests do, has got past its login shell's start (the pause
// waits for it) and its sleep counts through the pause too.
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
	ready := "cd /tmp/out && for i in $(seq 600); do [ -e python.ready ] && [ -e node.ready ] && [ -e grandchild.ready ] && [ -e tcp.ready ] && exit 0; sleep 0.05; done; ls; exit 1"
	sh(ready)
	sh(startCommand)
	p := s.(isolation.Pauser)
	if err := p.Pause(t.Context()); err != nil {
		t.Fatalf("Pause() = %v", err)
	}
	// Paused for longer than the timers' three seconds: each is due at
	// the resume. A timer that began only after the resume, or began
	// anew, would take its three seconds from there.
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
