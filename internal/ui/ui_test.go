package ui

import (
	"io/fs"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	h := Handler()
	for _, tt := range []struct {
		path        string
		status      int
		ctype, body string
	}{
		{"/", 200, "text/html; charset=utf-8", `<script type="module" src="app.js">`},
		{"/app.js", 200, "text/javascript; charset=utf-8", "import"},
		{"/vendor/xterm.mjs", 200, "text/javascript; charset=utf-8", "Terminal"},
		{"/vendor/xterm.css", 200, "text/css; charset=utf-8", ".xterm"},
		{"/nothing.js", 404, "", ""},
		{"/../ui.go", 404, "", ""},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "http://x"+tt.path, nil))
		if rec.Code != tt.status {
			t.Errorf("GET %s = %d, want %d", tt.path, rec.Code, tt.status)
			continue
		}
		if tt.ctype != "" && rec.Header().Get("Content-Type") != tt.ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", tt.path, rec.Header().Get("Content-Type"), tt.ctype)
		}
		if !strings.Contains(rec.Body.String(), tt.body) {
			t.Errorf("GET %s: body lacks %q", tt.path, tt.body)
		}
	}
}

// TestNoHTMLFromStrings: the dashboard's own code never parses a string as
// HTML or code (what a sandbox controls is shown as text), and its page
// has no inline script or handler, which the Content-Security-Policy would
// refuse anyway.
func TestNoHTMLFromStrings(t *testing.T) {
	banned := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|setTimeout\(['"]|createContextualFragment|DOMParser`)
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "assets/vendor/") {
			return err
		}
		b, err := fs.ReadFile(assets, p)
		if err != nil {
			return err
		}
		if m := banned.FindString(string(b)); m != "" {
			t.Errorf("%s uses %s", p, m)
		}
		if strings.HasSuffix(p, ".html") {
			for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAllString(string(b), -1) {
				if !strings.Contains(tag, "src=") {
					t.Errorf("%s has an inline script: %s", p, tag)
				}
			}
			if m := regexp.MustCompile(`\son[a-z]+=`).FindString(string(b)); m != "" {
				t.Errorf("%s has an inline handler: %s", p, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
