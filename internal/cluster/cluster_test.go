package cluster

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/fake"

	"github.com/fencesandbox/fence/api"
)

func TestIDsCarryTheTag(t *testing.T) {
	tag := Tag("node-a")
	if len(tag) != TagLen || Tag("node-a") != tag || Tag("node-b") == tag {
		t.Fatalf("Tag: %q", tag)
	}
	seen := map[string]bool{}
	for range 1000 {
		id := NewID(tag)
		if !api.ValidSandboxID(id) || len(id) != 20 || seen[id] {
			t.Fatalf("NewID: %q", id)
		}
		seen[id] = true
		if got, ok := TagOf(id); !ok || got != tag {
			t.Fatalf("TagOf(%q) = %q %v", id, got, ok)
		}
	}
	if _, ok := TagOf("short"); ok {
		t.Error("TagOf accepts an ID of another shape")
	}
}

func TestRequireToken(t *testing.T) {
	var sawToken string
	h := RequireToken("secret", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawToken = r.Header.Get(HeaderToken)
		w.WriteHeader(204)
	}))
	cases := []struct {
		host, path, token string
		sandbox           bool
		want              int
	}{
		{"127.0.0.1:3000", "/v2/sandboxes", "", false, 401},
		{"127.0.0.1:3000", "/v2/sandboxes", "secreT", false, 401},
		{"127.0.0.1:3000", "/v2/sandboxes", "secret", false, 204},
		{"127.0.0.1:3000", "/health", "", false, 204},
		{"[::1]:3000", "/health", "", false, 204},
		// A sandbox's /health is sandbox traffic: token needed.
		{"49983-abc.localhost", "/health", "", false, 401},
		{"127.0.0.1:3000", "/health", "", true, 401},
	}
	for _, c := range cases {
		r := httptest.NewRequest("GET", "http://"+c.host+c.path, nil)
		if c.token != "" {
			r.Header.Set(HeaderToken, c.token)
		}
		if c.sandbox {
			r.Header.Set("E2b-Sandbox-Id", "abc")
		}
		w := httptest.NewRecorder()
		sawToken = "unset"
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s%s token %q: %d, want %d", c.host, c.path, c.token, w.Code, c.want)
		}
		if w.Code == 204 && sawToken != "" {
			t.Errorf("the token reached the handler: %q", sawToken)
		}
	}
	w := httptest.NewRecorder()
	RequireToken("", h).ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1/x", nil))
	if w.Code != 401 {
		t.Errorf("empty token lets requests through: %d", w.Code)
	}
}

// TestRegisterWatchExpire registers two nodes against a fake API, and
// checks the watcher's view: status, drain, tag clash, expiry by its own
// clock and release.
func TestRegisterWatchExpire(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// An empty scheme: the fake keeps Leases as the API server sends
	// them to the dynamic client, unstructured.
	kube := fake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{leaseResource: "LeaseList"})
	load := func() (int, int, []string) { return 10, 3, []string{"minimal"} }
	reg := func(name string) (*Registrar, error) {
		return Register(ctx, RegistrarOptions{Client: kube, Namespace: "fence", Name: name, URL: "http://" + name, Load: load})
	}
	a, err := reg("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg("node-b"); err != nil {
		t.Fatal(err)
	}
	w, err := Watch(ctx, kube, "fence", nil)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(w.Nodes()) == 2 })
	n, ok := w.Node(Tag("node-a"))
	if !ok || n.URL != "http://node-a" || n.Free() != 7 || !n.HasTemplate("minimal") || !n.Placeable() {
		t.Fatalf("node-a as watched: %+v %v", n, ok)
	}
	if err := a.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { n, _ := w.Node(Tag("node-a")); return !n.Placeable() })

	// Expiry by the watcher's clock, not the node's.
	w.now = func() time.Time { return time.Now().Add(DefaultLeaseDuration + time.Second) }
	if _, ok := w.Node(Tag("node-a")); ok || len(w.Nodes()) != 0 {
		t.Error("nodes not renewed within their lease stay live")
	}
	w.now = time.Now
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := w.Node(Tag("node-a")); return !ok })
	if len(w.Nodes()) != 1 {
		t.Errorf("after node-a's release: %v", w.Nodes())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
