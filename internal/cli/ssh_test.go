package cli

import (
	"slices"
	"testing"
)

func TestSSHArgs(t *testing.T) {
	got, err := sshArgs("http://0.0.0.0:3000", "abc123", 2222, []string{"-i", "k", "uname"})
	if want := []string{"-p", "2222", "abc123@127.0.0.1", "-i", "k", "uname"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("sshArgs = %q, %v; want %q", got, err, want)
	}
	got, err = sshArgs("https://fence.example.com", "abc123", 22, nil)
	if want := []string{"-p", "22", "abc123@fence.example.com"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("sshArgs = %q, %v; want %q", got, err, want)
	}
	for _, id := range []string{"", "-oProxyCommand=x", "a@b"} {
		if _, err := sshArgs("http://h", id, 22, nil); err == nil {
			t.Errorf("sshArgs(%q) accepted a bad ID", id)
		}
	}
}
