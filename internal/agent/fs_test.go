package agent

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/fencesandbox/fence/api/envd/filesystem"
	"github.com/fencesandbox/fence/internal/agent/boot"
)

func (e *env) filesURL(path, user string) string {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	if user != "" {
		q.Set("username", user)
	}
	return e.url + "/files?" + q.Encode()
}

type writeResult struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata"`
}

func doJSON(t *testing.T, req *http.Request, wantStatus int, out any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s = %d %s, want %d", req.Method, req.URL, resp.StatusCode, body, wantStatus)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("decoding %s: %v", body, err)
		}
	}
}

func owner(t *testing.T, path string) (uint32, uint32, os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid, fi.Mode()
}

func TestFilesUploadDownload(t *testing.T) {
	e := newEnv(t, boot.Config{})
	// Octet-stream upload as nobody into new parents, with metadata.
	dest := e.dir + "/a/b/c.txt"
	req, _ := http.NewRequest("POST", e.filesURL(dest, "nobody"), strings.NewReader("hello"))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("X-Metadata-Color", "blue")
	var res []writeResult
	doJSON(t, req, 200, &res)
	if len(res) != 1 || res[0].Path != dest || res[0].Name != "c.txt" || res[0].Type != "file" || res[0].Metadata["color"] != "blue" {
		t.Errorf("upload response = %+v", res)
	}
	for _, p := range []string{dest, e.dir + "/a/b", e.dir + "/a"} {
		if uid, gid, mode := owner(t, p); uid != 65534 || gid != 65534 {
			t.Errorf("owner of %s = %d:%d (%v), want nobody 65534:65534", p, uid, gid, mode)
		}
	}
	if _, _, mode := owner(t, dest); mode.Perm() != 0o644 {
		t.Errorf("mode of %s = %v, want 0644", dest, mode)
	}
	st, err := e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: dest}))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.GetEntry(); got.GetMetadata()["color"] != "blue" || got.GetOwner() != "nobody" || got.GetSize() != 5 || got.GetMode() != 0o644 || got.GetPermissions() != "-rw-r--r--" {
		t.Errorf("Stat(%s) = %v", dest, got)
	}

	// Gzip-encoded octet-stream upload overwrites (truncates) and clears metadata.
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte("hi"))
	zw.Close()
	req, _ = http.NewRequest("POST", e.filesURL(dest, ""), &zb)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Encoding", "gzip")
	doJSON(t, req, 200, &res)
	if b, _ := os.ReadFile(dest); string(b) != "hi" {
		t.Errorf("after gzip upload content = %q, want hi", b)
	}
	st, _ = e.fs.Stat(context.Background(), connect.NewRequest(&fspb.StatRequest{Path: dest}))
	if md := st.Msg.GetEntry().GetMetadata(); len(md) != 0 {
		t.Errorf("metadata after re-upload = %v, want none", md)
	}

	// Plain download (no implicit Accept-Encoding: gzip).
	req, _ = http.NewRequest("GET", e.filesURL(dest, "root"), nil)
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hi" || resp.Header.Get("Content-Length") != "2" {
		t.Errorf("GET /files = %d %q (len %s), want 200 hi", resp.StatusCode, body, resp.Header.Get("Content-Length"))
	}

	// Gzip download (the transport must not decode it for us).
	big := strings.Repeat("gzip me ", 1000)
	os.WriteFile(e.dir+"/big.txt", []byte(big), 0o644)
	req, _ = http.NewRequest("GET", e.filesURL(e.dir+"/big.txt", ""), nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err = http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Errorf("Content-Encoding = %q, want gzip", resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(zr)
	resp.Body.Close()
	if string(body) != big {
		t.Errorf("gunzipped download = %d bytes, want %d", len(body), len(big))
	}

	// Empty file: Content-Length: 0.
	os.WriteFile(e.dir+"/empty", nil, 0o644)
	req, _ = http.NewRequest("GET", e.filesURL(e.dir+"/empty", ""), nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err = http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Length") != "0" {
		t.Errorf("GET empty file = %d, Content-Length %q; want 200, 0", resp.StatusCode, resp.Header.Get("Content-Length"))
	}

	// Errors.
	for _, tt := range []struct {
		url  string
		code int
	}{
		{e.filesURL(e.dir, ""), 400},
		{e.filesURL(e.dir+"/missing", ""), 404},
		{e.filesURL(dest, "no-such-user-xyz"), 401},
	} {
		resp, err := http.Get(tt.url)
		if err != nil {
			t.Fatal(err)
		}
		var je struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		json.NewDecoder(resp.Body).Decode(&je)
		resp.Body.Close()
		if resp.StatusCode != tt.code || je.Code != tt.code || je.Message == "" {
			t.Errorf("GET %s = %d %+v, want %d JSON error", tt.url, resp.StatusCode, je, tt.code)
		}
	}
}

func multipartBody(t *testing.T, files map[string]string, order []string) (*bytes.Buffer, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, name := range order {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+name+`"`)
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(files[name]))
	}
	mw.Close()
	return &b, mw.FormDataContentType()
}

func TestFilesMultipart(t *testing.T) {
	e := newEnv(t, boot.Config{})
	files := map[string]string{
		e.dir + "/m/one.txt":     "1",
		e.dir + "/m/sub/two.txt": "22",
		"rel.txt":                "rel", // relative: against the user's home
	}
	order := []string{e.dir + "/m/one.txt", e.dir + "/m/sub/two.txt"}
	body, ct := multipartBody(t, files, order)
	req, _ := http.NewRequest("POST", e.filesURL("", ""), body)
	req.Header.Set("Content-Type", ct)
	var res []writeResult
	doJSON(t, req, 200, &res)
	if len(res) != 2 || res[0].Path != order[0] || res[1].Path != order[1] {
		t.Errorf("multipart response = %+v", res)
	}
	for _, p := range order {
		if b, _ := os.ReadFile(p); string(b) != files[p] {
			t.Errorf("%s = %q, want %q", p, b, files[p])
		}
	}

	// ?path= overrides the filename.
	body, ct = multipartBody(t, map[string]string{"ignored.txt": "x"}, []string{"ignored.txt"})
	req, _ = http.NewRequest("POST", e.filesURL(e.dir+"/override.txt", ""), body)
	req.Header.Set("Content-Type", ct)
	doJSON(t, req, 200, &res)
	if b, _ := os.ReadFile(e.dir + "/override.txt"); string(b) != "x" {
		t.Errorf("override.txt = %q, want x", b)
	}

	// Duplicate path → 400; directory → 400.
	dup := e.dir + "/dup.txt"
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i < 2; i++ {
		w, _ := mw.CreateFormFile("file", dup)
		w.Write([]byte("d"))
	}
	mw.Close()
	req, _ = http.NewRequest("POST", e.filesURL("", ""), &b)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	doJSON(t, req, 400, nil)
	req, _ = http.NewRequest("POST", e.filesURL(e.dir, ""), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	doJSON(t, req, 400, nil)
	req, _ = http.NewRequest("POST", e.filesURL(e.dir+"/x", "no-such-user-xyz"), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	doJSON(t, req, 401, nil)
}

func TestListDirMakeDirRemove(t *testing.T) {
	e := newEnv(t, boot.Config{})
	ctx := context.Background()
	d := e.dir
	os.MkdirAll(d+"/x/y/z", 0o755)
	os.WriteFile(d+"/x/f", []byte("f"), 0o644)
	os.WriteFile(d+"/x/y/g", []byte("g"), 0o644)
	os.WriteFile(d+"/x/y/z/h", []byte("h"), 0o644)

	for _, tt := range []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"f", "y"}},
		{1, []string{"f", "y"}},
		{2, []string{"f", "y", "y/g", "y/z"}},
		{5, []string{"f", "y", "y/g", "y/z", "y/z/h"}},
	} {
		res, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: d + "/x", Depth: tt.depth}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, en := range res.Msg.GetEntries() {
			got = append(got, strings.TrimPrefix(en.GetPath(), d+"/x/"))
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("ListDir(depth %d) = %v, want %v", tt.depth, got, tt.want)
		}
	}
	_, err := e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: d + "/missing"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("ListDir(missing) = %v, want not_found", err)
	}
	_, err = e.fs.ListDir(ctx, connect.NewRequest(&fspb.ListDirRequest{Path: d + "/x/f"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("ListDir(file) = %v, want invalid_argument", err)
	}

	mk := connect.NewRequest(&fspb.MakeDirRequest{Path: d + "/new/deep"})
	mk.Header().Set("Authorization", basic("nobody"))
	res, err := e.fs.MakeDir(ctx, mk)
	if err != nil {
		t.Fatal(err)
	}
	if en := res.Msg.GetEntry(); en.GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || en.GetOwner() != "nobody" || en.GetName() != "deep" {
		t.Errorf("MakeDir entry = %v", en)
	}
	if uid, _, _ := owner(t, d+"/new"); uid != 65534 {
		t.Errorf("parent created by MakeDir owned by %d, want 65534", uid)
	}
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: d + "/new/deep"}))
	if connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("MakeDir(existing) = %v, want already_exists", err)
	}
	_, err = e.fs.MakeDir(ctx, connect.NewRequest(&fspb.MakeDirRequest{Path: d + "/x/f"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("MakeDir(file) = %v, want invalid_argument", err)
	}

	mv, err := e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: d + "/x/f", Destination: d + "/moved/f2"}))
	if err != nil || mv.Msg.GetEntry().GetPath() != d+"/moved/f2" {
		t.Errorf("Move = %v, %v", mv, err)
	}
	_, err = e.fs.Move(ctx, connect.NewRequest(&fspb.MoveRequest{Source: d + "/nope", Destination: d + "/nope2"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Move(missing) = %v, want not_found", err)
	}

	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: d + "/x"})); err != nil {
		t.Errorf("Remove(tree) = %v", err)
	}
	if _, err := os.Stat(d + "/x"); !os.IsNotExist(err) {
		t.Errorf("after Remove, stat = %v", err)
	}
	if _, err := e.fs.Remove(ctx, connect.NewRequest(&fspb.RemoveRequest{Path: d + "/does-not-exist"})); err != nil {
		t.Errorf("Remove(missing) = %v, want ok", err)
	}
	_, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: d + "/does-not-exist"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("Stat(missing) = %v, want not_found", err)
	}
	bad := connect.NewRequest(&fspb.StatRequest{Path: d})
	bad.Header().Set("Authorization", basic("no-such-user-xyz"))
	if _, err := e.fs.Stat(ctx, bad); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("Stat(unknown user) = %v, want unauthenticated", err)
	}
}

func TestSymlinkEntryInfo(t *testing.T) {
	e := newEnv(t, boot.Config{})
	ctx := context.Background()
	os.WriteFile(e.dir+"/target.txt", []byte("abc"), 0o600)
	os.Mkdir(e.dir+"/tdir", 0o755)
	os.Symlink("target.txt", e.dir+"/link")
	os.Symlink(e.dir+"/tdir", e.dir+"/dlink")
	tests := []struct {
		path, target string
		typ          fspb.FileType
		mode         uint32
	}{
		{e.dir + "/link", e.dir + "/target.txt", fspb.FileType_FILE_TYPE_FILE, 0o600},
		{e.dir + "/dlink", e.dir + "/tdir", fspb.FileType_FILE_TYPE_DIRECTORY, 0o755},
	}
	for _, tt := range tests {
		res, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: tt.path}))
		if err != nil {
			t.Fatal(err)
		}
		en := res.Msg.GetEntry()
		if en.GetType() != tt.typ || en.GetSymlinkTarget() != tt.target || en.GetMode() != tt.mode || en.GetName() != filepath.Base(tt.path) {
			t.Errorf("Stat(%s) = %v, want type %v target %s mode %o", tt.path, en, tt.typ, tt.target, tt.mode)
		}
	}
	res, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: e.dir + "/target.txt"}))
	if err != nil {
		t.Fatal(err)
	}
	if en := res.Msg.GetEntry(); en.SymlinkTarget != nil || en.GetOwner() != "root" || en.GetGroup() != "root" || en.GetModifiedTime() == nil {
		t.Errorf("Stat(regular) = %v", en)
	}
	// Relative and ~ paths resolve against the user's home (root: /root).
	res, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: "~"}))
	if err != nil || res.Msg.GetEntry().GetPath() != "/root" {
		t.Errorf("Stat(~) = %v, %v; want /root", res, err)
	}
	res, err = e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: ""}))
	if err != nil || res.Msg.GetEntry().GetPath() != e.dir {
		t.Errorf("Stat(\"\") = %v, %v; want default workdir %s", res, err, e.dir)
	}
}

func TestWatchDirRecursive(t *testing.T) {
	e := newEnv(t, boot.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := connect.NewRequest(&fspb.WatchDirRequest{Path: e.dir, Recursive: true, IncludeEntry: true})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	st, err := e.fs.WatchDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("first watch event = %v (%v), want start", st.Msg(), st.Err())
	}
	os.Mkdir(e.dir+"/nested", 0o755)
	// Wait for the nested dir's create before writing into it, so the new
	// subdirectory is being watched.
	want := map[string]fspb.EventType{"nested": fspb.EventType_EVENT_TYPE_CREATE}
	sawKeepalive := false
	next := func() {
		for len(want) > 0 {
			if !st.Receive() {
				t.Fatalf("watch ended: %v; still want %v", st.Err(), want)
			}
			if st.Msg().GetKeepalive() != nil {
				sawKeepalive = true
			}
			fe := st.Msg().GetFilesystem()
			if fe != nil && want[fe.GetName()] == fe.GetType() {
				if fe.GetType() == fspb.EventType_EVENT_TYPE_CREATE && fe.GetEntry().GetName() != filepath.Base(fe.GetName()) {
					t.Errorf("event %v: entry missing", fe)
				}
				delete(want, fe.GetName())
			}
		}
	}
	next()
	want = map[string]fspb.EventType{"nested/test_watch.txt": fspb.EventType_EVENT_TYPE_CREATE}
	os.WriteFile(e.dir+"/nested/test_watch.txt", []byte("x"), 0o644)
	next()
	want = map[string]fspb.EventType{"nested/test_watch.txt": fspb.EventType_EVENT_TYPE_REMOVE}
	os.Remove(e.dir + "/nested/test_watch.txt")
	next()
	for !sawKeepalive {
		if !st.Receive() {
			t.Fatalf("watch ended: %v", st.Err())
		}
		sawKeepalive = st.Msg().GetKeepalive() != nil
	}

	_, err = e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: e.dir + "/missing"}))
	if err == nil {
		st2, _ := e.fs.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: e.dir + "/missing"}))
		st2.Receive()
		err = st2.Err()
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("WatchDir(missing) = %v, want not_found", err)
	}
}

func TestPollingWatcher(t *testing.T) {
	e := newEnv(t, boot.Config{})
	ctx := context.Background()
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&fspb.CreateWatcherRequest{Path: e.dir}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	os.WriteFile(e.dir+"/p.txt", []byte("x"), 0o644)
	deadline := time.Now().Add(10 * time.Second)
	found := false
	for !found && time.Now().Before(deadline) {
		res, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range res.Msg.GetEvents() {
			found = found || (ev.GetName() == "p.txt" && ev.GetType() == fspb.EventType_EVENT_TYPE_CREATE)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !found {
		t.Error("GetWatcherEvents never reported p.txt created")
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = e.fs.GetWatcherEvents(ctx, connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetWatcherEvents(removed) = %v, want not_found", err)
	}
}

// TestFilesActAsUser proves that the file routes act with the requesting
// user's credentials: a symlink the user planted at an upload or download
// path (or a parent) cannot make the agent, which runs as root, write or
// read root's files, and nothing of root's changes. Root: the agent test
// serves as root and asks as nobody.
func TestFilesActAsUser(t *testing.T) {
	e := newEnv(t, boot.Config{})
	secretDir := t.TempDir()
	os.Chmod(filepath.Dir(secretDir), 0o755)
	os.Chmod(secretDir, 0o755)
	secret := filepath.Join(secretDir, "secret")
	if err := os.WriteFile(secret, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	passwd := filepath.Join(secretDir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0"), 0o644); err != nil {
		t.Fatal(err)
	}
	// What the user (nobody) plants in its own directory.
	if err := os.Symlink(passwd, e.dir+"/up"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, e.dir+"/down"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secretDir, e.dir+"/dir"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{e.dir + "/up", e.dir + "/dir/passwd", e.dir + "/dir/new"} {
		req, _ := http.NewRequest("POST", e.filesURL(p, "nobody"), strings.NewReader("owned"))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("upload as nobody to %s (a symlink to root's) = %d, want 403", p, resp.StatusCode)
		}
	}
	if b, _ := os.ReadFile(passwd); string(b) != "root:x:0:0" {
		t.Errorf("root's file after uploads through symlinks = %q, want unchanged", b)
	}
	if _, err := os.Lstat(filepath.Join(secretDir, "new")); err == nil {
		t.Errorf("an upload as nobody created a file in root's directory")
	}
	if uid, _, _ := owner(t, passwd); uid != 0 {
		t.Errorf("root's file now owned by %d", uid)
	}
	for _, p := range []string{e.dir + "/down", e.dir + "/dir/secret"} {
		resp, err := http.Get(e.filesURL(p, "nobody"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || strings.Contains(string(b), "root only") {
			t.Errorf("download as nobody of %s (a symlink to root's 0600 file) = %d %q, want 403", p, resp.StatusCode, b)
		}
	}
	ctx := context.Background()
	rm := connect.NewRequest(&fspb.RemoveRequest{Path: e.dir + "/dir/passwd"})
	rm.Header().Set("Authorization", basic("nobody"))
	if _, err := e.fs.Remove(ctx, rm); err == nil {
		t.Errorf("Remove as nobody of root's file through a symlinked directory succeeded")
	}
	if _, err := os.Stat(passwd); err != nil {
		t.Errorf("root's file after Remove as nobody: %v", err)
	}
	// Root, asking for itself, still reaches root's files.
	resp, err := http.Get(e.filesURL(e.dir+"/down", "root"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "root only" {
		t.Errorf("download as root = %d %q, want 200 and the file", resp.StatusCode, b)
	}
}
