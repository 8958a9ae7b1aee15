package process

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// maxSessionPasses bounds the scans of /proc that SIGKILL to a session
// makes: processes forked while one pass ran are found by the next.
const maxSessionPasses = 64

// signalSession sends sig to every live process of session sid other than
// the caller, and reports whether it found any. For SIGKILL it scans again
// until a pass finds none (or maxSessionPasses), so a process that forks
// while being hunted does not leave a child behind; another signal is sent
// once.
func signalSession(sid int, sig unix.Signal) bool {
	found := false
	for range maxSessionPasses {
		pids := sessionMembers(sid)
		if len(pids) == 0 {
			break
		}
		found = true
		for _, pid := range pids {
			_ = unix.Kill(pid, sig)
		}
		if sig != unix.SIGKILL {
			break
		}
	}
	return found
}

// sessionMembers lists the processes of session sid that have not exited
// (zombies excluded), leaving out the calling process.
func sessionMembers(sid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	self := os.Getpid()
	var pids []int
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session ...; comm may hold anything.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 4 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if got, err := strconv.Atoi(f[3]); err == nil && got == sid {
			pids = append(pids, pid)
		}
	}
	return pids
}
