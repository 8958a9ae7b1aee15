package tbuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

func TestParseName(t *testing.T) {
	for _, c := range []struct {
		in        string
		ns, alias string
		tag       string
		bad       bool
	}{
		{in: "app", alias: "app"},
		{in: " App:V1 ", alias: "app", tag: "v1"},
		{in: "team/app:default", ns: "team", alias: "app"},
		{in: "app:1.2.3", alias: "app", tag: "1.2.3"},
		{in: "", bad: true},
		{in: "a/b/c", bad: true},
		{in: "app:bad tag", bad: true},
		{in: "../etc", bad: true},
	} {
		n, err := ParseName(c.in)
		if c.bad {
			if !errors.Is(err, api.ErrInvalidArgument) {
				t.Errorf("ParseName(%q) = %+v, %v; want ErrInvalidArgument", c.in, n, err)
			}
			continue
		}
		if err != nil || n.Namespace != c.ns || n.Alias != c.alias || n.Tag != c.tag {
			t.Errorf("ParseName(%q) = %+v, %v", c.in, n, err)
		}
	}
}

func TestParseDockerfile(t *testing.T) {
	df, err := ParseDockerfile(`# a comment
ARG VERSION=3
FROM python:3 AS app
ENV A=1 B="two words"
ENV C three
COPY --chown=user:user --chmod=755 a.txt b/ /dest/
RUN apt-get update && \
    apt-get install -y curl
RUN ["echo", "exec form"]
EXPOSE 8000
CMD ["python", "-m", "http.server"]
`)
	if err != nil {
		t.Fatal(err)
	}
	if df.FromImage != "python:3" || df.StartCmd != "python -m http.server" || df.ReadyCmd != "sleep 20" {
		t.Errorf("df = %+v", df)
	}
	var got []string
	for _, s := range df.Steps {
		got = append(got, s.Type+" "+strings.Join(s.Args, "|"))
	}
	want := []string{"USER root", "WORKDIR /", "ENV A|1|B|two words", "ENV C|three",
		"COPY a.txt|/dest/|user|0755", "COPY b/|/dest/|user|0755",
		"RUN apt-get update &&      apt-get install -y curl", "RUN echo exec form", "USER user", "WORKDIR /home/user"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("steps:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, c := range []struct{ in, want string }{
		{"RUN x", "line 1: RUN before FROM"},
		{"FROM a\nFROM b", "line 2: multi-stage"},
		{"FROM a\n\nHEALTHCHECK CMD true", "line 3: unsupported instruction HEALTHCHECK"},
		{"FROM a\nADD https://x/y /z", "line 2: ADD from a URL"},
		{"FROM a\nCOPY --from=b /x /y", "line 2: COPY --from is not supported"},
		{"ENV A=1", "line 1: ENV before FROM"},
		{"", "no FROM"},
	} {
		_, err := ParseDockerfile(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("ParseDockerfile(%q) = %v, want an error with %q", c.in, err, c.want)
		}
	}
}

// layerTar writes an archive as isolation.LayerReader.ExportLayer does.
func layerTar(t *testing.T, entries []tar.Header, contents map[string]string, whiteouts string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h.Name = "changes/" + h.Name
		body := contents[h.Name]
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.WriteHeader(&tar.Header{Name: "changes/.whiteouts", Typeflag: tar.TypeReg, Size: int64(len(whiteouts)), Mode: 0o644})
	tw.Write([]byte(whiteouts))
	tw.Close()
	p := filepath.Join(t.TempDir(), "layer.tar")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A layer is applied to a clone without writing the parent's files (they
// are shared hard links) and without following a symlink of the tree to
// outside it.
func TestApplyLayerSafety(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (chown)")
	}
	dir := t.TempDir()
	parent := filepath.Join(dir, "parent")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{parent + "/etc", parent + "/opaque/old", parent + "/gone", outside} {
		os.MkdirAll(d, 0o755)
	}
	os.WriteFile(parent+"/etc/shared", []byte("parent content"), 0o644)
	os.WriteFile(parent+"/opaque/old/f", []byte("x"), 0o644)
	os.WriteFile(parent+"/gone/f", []byte("x"), 0o644)
	// Both links lead to a directory of the test's own, never to a host
	// path: a broken applyLayer must not be able to harm the machine.
	os.Symlink(outside, parent+"/escape")
	os.Symlink("../outside", parent+"/rellink")

	child := filepath.Join(dir, "child")
	if err := cloneTree(context.Background(), parent, child); err != nil {
		t.Fatal(err)
	}
	var a, b syscall.Stat_t
	syscall.Stat(parent+"/etc/shared", &a)
	syscall.Stat(child+"/etc/shared", &b)
	if a.Ino != b.Ino {
		t.Fatalf("clone did not hard-link files")
	}
	now := time.Now()
	layer := layerTar(t, []tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now},
		{Name: "etc/shared", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1<<24 + 3*65536 + 1000, Gid: 1<<24 + 3*65536 + 1000, ModTime: now},
		{Name: "opaque/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now},
		{Name: "opaque/new", Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now},
	}, map[string]string{"changes/etc/shared": "child content", "changes/opaque/new": "n"}, "# header\n/gone\n/opaque/ opaque\n")
	if err := applyLayer(context.Background(), child, layer); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(parent + "/etc/shared"); string(b) != "parent content" {
		t.Errorf("the parent's file was written through its hard link: %q", b)
	}
	if b, _ := os.ReadFile(child + "/etc/shared"); string(b) != "child content" {
		t.Errorf("child file = %q", b)
	}
	var st syscall.Stat_t
	syscall.Stat(child+"/etc/shared", &st)
	if st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o755 {
		t.Errorf("child file uid %d gid %d mode %o, want 1000 1000 755 (sandbox ids mapped back, set-id bits cleared)", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if _, err := os.Lstat(child + "/gone"); !os.IsNotExist(err) {
		t.Errorf("whiteout not applied: %v", err)
	}
	if _, err := os.Lstat(child + "/opaque/old"); !os.IsNotExist(err) {
		t.Errorf("opaque directory kept the parent's entries: %v", err)
	}
	if _, err := os.Lstat(parent + "/opaque/old/f"); err != nil {
		t.Errorf("the parent lost a file: %v", err)
	}

	// Entries below a symlink of the tree are refused, never followed.
	for _, name := range []string{"escape/pwned", "rellink/pwned"} {
		evil := layerTar(t, []tar.Header{{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, ModTime: now}},
			map[string]string{"changes/" + name: "pwned"}, "")
		if err := applyLayer(context.Background(), child, evil); err == nil {
			t.Errorf("applying %s through a symlink succeeded", name)
		}
	}
	os.WriteFile(outside+"/victim", []byte("keep"), 0o644)
	os.WriteFile(outside+"/victim2", []byte("keep"), 0o644)
	evil := layerTar(t, nil, nil, "/escape/victim\n/rellink/victim2\n/escape/ opaque\n")
	_ = applyLayer(context.Background(), child, evil)
	if entries, _ := os.ReadDir(outside); len(entries) != 2 {
		t.Errorf("a whiteout below a symlink removed files outside the tree: %d entries left, want 2", len(entries))
	}
}

func TestStoreArchive(t *testing.T) {
	dir := t.TempDir()
	hash := strings.Repeat("ab", 32)
	tarOf := func(hdrs ...tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	good := tarOf(tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755}, tar.Header{Name: "app/a", Typeflag: tar.TypeReg, Mode: 0o644})
	for _, c := range []struct {
		name string
		body []byte
		ok   bool
	}{
		{"plain tar", good, true},
		{"gzipped tar", gz(good), true},
		{"garbage", []byte("this is not a tar archive at all, not even close....."), false},
		{"truncated gzip", gz(good)[:20], false},
		{"dot-dot entry", tarOf(tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}), false},
		{"absolute entry", tarOf(tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}), false},
		{"device entry", tarOf(tar.Header{Name: "dev", Typeflag: tar.TypeChar, Mode: 0o644}), false},
		{"too large", gz(bytes.Repeat(good, 1)), true},
	} {
		os.RemoveAll(filepath.Join(dir, hash+".tar"))
		_, _, err := storeArchive(context.Background(), dir, hash, bytes.NewReader(c.body), 1<<20)
		if c.ok != (err == nil) {
			t.Errorf("%s: err = %v", c.name, err)
		}
		if err != nil && !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", c.name, err)
		}
		_, serr := os.Stat(filepath.Join(dir, hash+".tar"))
		if c.ok != (serr == nil) {
			t.Errorf("%s: kept = %v", c.name, serr == nil)
		}
	}
	if _, _, err := storeArchive(context.Background(), dir, hash, bytes.NewReader(bytes.Repeat([]byte{0}, 4096)), 1024); err == nil {
		t.Errorf("an archive above the limit was kept")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("leftover %s", e.Name())
		}
	}
}

func TestBuildAllowAndPipIndex(t *testing.T) {
	if err := CheckAllow([]string{"mirror.internal:8080", "10.1.2.3:3142", "*.corp.example", "@pypi", "198.18.0.0/29:80,443"}); err != nil {
		t.Errorf("CheckAllow(good entries): %v", err)
	}
	for _, bad := range []string{"", "foo bar", "mirror:99999", "10.0.0.0/33", "http://mirror/"} {
		if err := CheckAllow([]string{bad}); err == nil {
			t.Errorf("CheckAllow(%q) = nil, want an error", bad)
		}
	}
	p, err := ParsePipIndex("http://10.1.2.3:8080/simple")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.allow(); got != "10.1.2.3:8080" {
		t.Errorf("allow entry %q", got)
	}
	env := p.env()
	if env["PIP_INDEX_URL"] != "http://10.1.2.3:8080/simple" || env["PIP_TRUSTED_HOST"] != "10.1.2.3:8080" {
		t.Errorf("env %v", env)
	}
	if p, err := ParsePipIndex("https://pypi.corp.example/root/simple/"); err != nil || p.allow() != "pypi.corp.example:443" || p.env()["PIP_TRUSTED_HOST"] != "" {
		t.Errorf("https index: %+v %v", p, err)
	}
	for _, bad := range []string{"ftp://x/simple", "http:///simple", "http://u:p@x/simple", "http://x/simple?a=1", "x/simple", "http://x/sim ple"} {
		if _, err := ParsePipIndex(bad); err == nil {
			t.Errorf("ParsePipIndex(%q) = nil error", bad)
		}
	}
}
