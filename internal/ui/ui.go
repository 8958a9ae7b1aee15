// Package ui holds fence's web dashboard: plain ES modules, a stylesheet
// and the vendored xterm.js, embedded in the binary (no build step, no
// CDN). The daemon serves them under /ui (httpapi.Options.UI), and so
// does fence router (router.Options.UI); the pages call the API's own
// JSON routes with the dashboard's session cookie and CSRF token, and
// render everything a sandbox controls as text.
//
// xterm.js is pinned by web/package-lock.json and copied into
// assets/vendor by web/vendor.sh; the copies are committed, so building
// fence needs no npm.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// types are the Content-Types of the assets, whatever the host's MIME
// table says: a module script served as text/plain is refused under
// X-Content-Type-Options: nosniff.
var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// Handler serves the dashboard's assets at their paths under the prefix
// the caller strips ("/" is index.html). Unknown paths answer 404.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := path.Clean("/" + r.URL.Path)
		if p == "/" {
			p = "/index.html"
		}
		b, err := fs.ReadFile(sub, strings.TrimPrefix(p, "/"))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		ct, ok := types[path.Ext(p)]
		if !ok {
			ct = "application/octet-stream"
		}
		w.Header().Set("Content-Type", ct)
		// The pages change with the binary: revalidate every load.
		w.Header().Set("Cache-Control", "no-cache")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(b)
	})
}
