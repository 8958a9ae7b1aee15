package users

import (
	"encoding/base64"
	"errors"
	"net/http"
	"path/filepath"
	"testing"
)

func TestResolvePath(t *testing.T) {
	u := &User{Name: "user", Home: "/home/user"}
	tests := []struct {
		workdir, in, want string
	}{
		{"", "", "/home/user"},
		{"/work", "", "/work"},
		{"/work", "~", "/home/user"},
		{"/work", "~/a/../b", "/home/user/b"},
		{"/work", "rel/x", "/home/user/rel/x"},
		{"/work", "/abs//y/", "/abs/y"},
		{"/work", "/../../etc", "/etc"},
	}
	for _, tt := range tests {
		r := &Resolver{DefaultWorkdir: tt.workdir}
		if got := r.ResolvePath(tt.in, u); got != tt.want {
			t.Errorf("ResolvePath(%q) with workdir %q = %q, want %q", tt.in, tt.workdir, got, tt.want)
		}
	}
}

func TestFromHeader(t *testing.T) {
	r := &Resolver{DefaultUser: "root"}
	tests := []struct {
		auth    string
		want    string
		wantErr bool
	}{
		{"", "root", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("nobody:")), "nobody", false},
		{"basic " + base64.StdEncoding.EncodeToString([]byte("root:ignored")), "root", false},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("no-such-user-xyz:")), "", true},
		{"Bearer abc", "", true},
		{"Basic !!!", "", true},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.auth != "" {
			h.Set("Authorization", tt.auth)
		}
		u, err := r.FromHeader(h)
		if tt.wantErr {
			if !errors.Is(err, ErrUnknownUser) {
				t.Errorf("FromHeader(%q) = %v, %v; want ErrUnknownUser", tt.auth, u, err)
			}
			continue
		}
		if err != nil || u.Name != tt.want {
			t.Errorf("FromHeader(%q) = %v, %v; want %s", tt.auth, u, err, tt.want)
		}
	}
	u, err := Lookup("nobody")
	if err != nil || u.UID != 65534 || len(u.Groups) == 0 {
		t.Errorf("Lookup(nobody) = %+v, %v; want uid 65534 with groups", u, err)
	}
}

// FuzzResolvePath: whatever a request names, the result is absolute and
// clean (inside the sandbox every absolute path is the sandbox's own).
func FuzzResolvePath(f *testing.F) {
	for _, s := range []string{"", "~", "~/a", "../../etc/passwd", "/a/../../b", "a//b/./c", "~root", "\x00"} {
		f.Add(s)
	}
	r := &Resolver{DefaultWorkdir: "/home/user"}
	u := &User{Name: "user", Home: "/home/user"}
	f.Fuzz(func(t *testing.T, p string) {
		got := r.ResolvePath(p, u)
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Errorf("ResolvePath(%q) = %q, want an absolute clean path", p, got)
		}
	})
}
