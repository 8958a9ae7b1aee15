package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fencesandbox/fence/internal/store"
)

const testPubKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJMnbLQwIXkzrOLEui8WQNB8OJAlzqWhdRsV8GiWyO0W laptop"

func TestSSHKeyRoutes(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "fence.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(New(Options{APIKey: testKey, SSHKeys: st}))
	defer srv.Close()
	do := func(method, path, body, key string) (int, string) {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := do("POST", "/ssh-keys", `{"publicKey":"`+testPubKey+`"}`, ""); code != 401 {
		t.Errorf("POST /ssh-keys without the API key = %d", code)
	}
	for _, bad := range []string{`{"publicKey":"ssh-ed25519 nonsense"}`, `{"publicKey":""}`, `{}`,
		`{"publicKey":"` + testPubKey + `\n` + testPubKey + `"}`} {
		if code, body := do("POST", "/ssh-keys", bad, testKey); code != 400 {
			t.Errorf("POST /ssh-keys %s = %d %s, want 400", bad, code, body)
		}
	}
	code, body := do("POST", "/ssh-keys", `{"publicKey":"`+testPubKey+`"}`, testKey)
	var k SSHKey
	if code != 201 || json.Unmarshal([]byte(body), &k) != nil || k.Name != "laptop" ||
		k.Fingerprint != "SHA256:E1t76fB9uVBmUhG2uhhjr/1PT0VKVqKgb2KOZ3tiyiY" || !strings.HasPrefix(k.ID, "sshkey_") {
		t.Fatalf("POST /ssh-keys = %d %s", code, body)
	}
	if code, body := do("POST", "/ssh-keys", `{"publicKey":"`+testPubKey+`","name":"again"}`, testKey); code != 409 {
		t.Errorf("POST /ssh-keys twice = %d %s, want 409", code, body)
	}
	code, body = do("GET", "/ssh-keys", "", testKey)
	var list []SSHKey
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list) != 1 || list[0].ID != k.ID {
		t.Errorf("GET /ssh-keys = %d %s", code, body)
	}
	if code, _ := do("DELETE", "/ssh-keys/"+k.ID, "", testKey); code != 204 {
		t.Errorf("DELETE = %d", code)
	}
	if code, _ := do("DELETE", "/ssh-keys/"+k.ID, "", testKey); code != 404 {
		t.Errorf("DELETE twice = %d, want 404", code)
	}
	if code, body := do("GET", "/ssh-keys", "", testKey); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("GET /ssh-keys after the delete = %d %s", code, body)
	}
}
