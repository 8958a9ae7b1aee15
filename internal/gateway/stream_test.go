package gateway

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

// chunked yields data in the given chunk sizes.
type chunked struct {
	data  []byte
	sizes []int
	err   error // returned instead of io.EOF at the end
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = min(n, c.sizes[0])
		c.sizes = c.sizes[1:]
	}
	n = copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func (c *chunked) Close() error { return nil }

func randomSizes(r *rand.Rand, total int) []int {
	var out []int
	for total > 0 {
		n := 1 + r.IntN(40)
		out = append(out, n)
		total -= n
	}
	return out
}

func TestReplaceReaderRandomChunks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	needles := []needle{
		{find: []byte("SECRETVALUE"), replace: []byte("${e2b.secrets.A}")},
		{find: []byte("SECRET"), replace: []byte("<short>")},
		{find: []byte("xyzzy-other"), replace: []byte("P")},
	}
	for i := 0; i < 2000; i++ {
		var in strings.Builder
		for j := 0; j < 30; j++ {
			switch r.IntN(5) {
			case 0:
				in.WriteString("SECRETVALUE")
			case 1:
				in.WriteString("xyzzy-other")
			case 2:
				in.WriteString("SECRET")
			default:
				in.WriteString(strings.Repeat("s", r.IntN(20)))
			}
		}
		want := in.String()
		want = strings.ReplaceAll(want, "SECRETVALUE", "\x00")
		want = strings.ReplaceAll(want, "SECRET", "<short>")
		want = strings.ReplaceAll(want, "xyzzy-other", "P")
		want = strings.ReplaceAll(want, "\x00", "${e2b.secrets.A}")
		eof := false
		rr := newReplaceReader(&chunked{data: []byte(in.String()), sizes: randomSizes(r, in.Len())}, needles, func() { eof = true })
		got, err := io.ReadAll(rr)
		if err != nil || string(got) != want || !eof {
			t.Fatalf("input %q\n got %q\nwant %q (err %v, eof %v)", in.String(), got, want, err, eof)
		}
	}
}

func TestReplaceReaderDropsHeldBytesOnError(t *testing.T) {
	boom := errors.New("cut")
	rr := newReplaceReader(&chunked{data: []byte("hello SECRE"), err: boom}, []needle{{find: []byte("SECRETVALUE"), replace: []byte("x")}}, nil)
	got, err := io.ReadAll(rr)
	if !errors.Is(err, boom) || bytes.Contains(got, []byte("SECRE")) {
		t.Fatalf("got %q err %v: the start of a value left on a failed stream", got, err)
	}
}

func TestLeakReaderRandomChunks(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ph := "e2b_ph_abcdefghijklmnop"
	for i := 0; i < 2000; i++ {
		prefix := bytes.Repeat([]byte("a"), r.IntN(200))
		data := append(append(append([]byte{}, prefix...), ph...), bytes.Repeat([]byte("b"), r.IntN(50))...)
		hit := ""
		lr := newLeakReader(&chunked{data: data, sizes: randomSizes(r, len(data))}, []needle{{find: []byte("other-placeholder-long-one"), secret: "O"}, {find: []byte(ph), secret: "S"}}, func(s string) { hit = s })
		got, err := io.ReadAll(lr)
		if !errors.Is(err, errPlaceholderLeak) || hit != "S" {
			t.Fatalf("not caught: err %v hit %q", err, hit)
		}
		if len(got) > len(prefix) || bytes.Contains(got, []byte(ph[:1])) && len(got) > len(prefix) {
			t.Fatalf("passed %d bytes, the placeholder starts at %d", len(got), len(prefix))
		}
	}
	// Clean data passes whole.
	data := bytes.Repeat([]byte("e2b_ph_abcdefghijklmno"), 1000)
	got, err := io.ReadAll(newLeakReader(&chunked{data: data, sizes: randomSizes(r, len(data))}, []needle{{find: []byte(ph), secret: "S"}}, func(string) { t.Fatal("false hit") }))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("clean body changed: %v", err)
	}
}

func TestArtifactOfRefuses(t *testing.T) {
	for _, c := range []struct{ host, path string }{
		{"files.pythonhosted.org", "/simple/requests/"},
		{"pypi.org", "/packages/x/requests-1.0.tar.gz"},
		{"registry.npmjs.org", "/left-pad"},
		{"registry.npmjs.org", "/left-pad/-/other-1.0.0.tgz"},
		{"deb.debian.org", "/debian/dists/bookworm/InRelease"},
		{"deb.debian.org", "/debian/pool/main/c/curl/curl_1.0.deb"},
		{"proxy.golang.org", "/github.com/!burnt!sushi/toml/@v/v1.3.2.mod"},
		{"proxy.golang.org", "/github.com/BurntSushi/toml/@v/v1.3.2.zip"},
		{"index.crates.io", "/se/rd/serde"},
		{"github.com", "/cli/cli/releases/tag/v2"},
		{"example.com", "/pool/main/c/curl/curl_1_amd64.deb"},
	} {
		if a, ok := artifactOf(c.host, c.path); ok {
			t.Errorf("%s%s recognised as %+v", c.host, c.path, a)
		}
	}
}

func FuzzArtifactOf(f *testing.F) {
	for _, s := range []string{
		"/packages/ab/requests-2.32.3-py3-none-any.whl", "/left-pad/-/left-pad-1.3.0.tgz",
		"/@types/node/-/node-20.11.5.tgz", "/debian/pool/main/c/curl/curl_7.88%3a1_amd64.deb",
		"/github.com/!burnt!sushi/toml/@v/v1.3.2.zip", "/crates/serde/serde-1.0.200.crate",
		"/api/v1/crates/rand/0.8.5/download", "/cli/cli/releases/download/v2/gh.tgz",
	} {
		f.Add("files.pythonhosted.org", s)
		f.Add("registry.npmjs.org", s)
		f.Add("deb.debian.org", s)
		f.Add("proxy.golang.org", s)
		f.Add("static.crates.io", s)
		f.Add("crates.io", s)
		f.Add("github.com", s)
	}
	f.Fuzz(func(t *testing.T, host, path string) {
		a, ok := artifactOf(host, path)
		if ok && (a.Ecosystem == "" || a.Name == "" || a.Version == "") {
			t.Fatalf("%s%s: incomplete %+v", host, path, a)
		}
	})
}

func FuzzScanQuery(f *testing.F) {
	f.Add("a=1&key=PH&z=%2F", true)
	f.Add("PH=1", true)
	f.Add("k=%50H", false)
	f.Fuzz(func(t *testing.T, raw string, allowed bool) {
		const ph = "PH"
		found, leak := scanQuery(raw, ph, allowed)
		if !allowed && found {
			t.Fatal("found in a disallowed place without a leak")
		}
		if !leak && found {
			out := replaceQuery(raw, ph, "VALUE")
			if strings.Contains(unescapeLenient(out), ph) && !strings.Contains(unescapeLenient(raw), "VALUE"+ph) {
				// every value holding the placeholder was replaced
				for _, part := range strings.Split(out, "&") {
					if _, v, _ := strings.Cut(part, "="); strings.Contains(unescapeLenient(v), ph) {
						t.Fatalf("placeholder left in %q (from %q)", out, raw)
					}
				}
			}
		}
		if !leak && !found && strings.Contains(raw, ph) {
			t.Fatalf("%q holds the placeholder but is neither found nor a leak", raw)
		}
	})
}
