package clienttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/fencesandbox/fence/api/envd/filesystem"
	"github.com/fencesandbox/fence/api/envd/filesystem/filesystemconnect"
	"github.com/fencesandbox/fence/api/envd/process"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
)

// Agent is a fake sandbox agent: envd's process and filesystem services and
// its /files and /health routes, over an in-memory filesystem. It is an
// http.Handler; serve it directly (as `fence run` reaches an agent) or
// through a Server.
//
// Start understands these commands (the argv is Cmd followed by Args):
//
//	echo ARGS…     prints ARGS joined by spaces and a newline to stdout
//	printerr ARGS… the same on stderr
//	exit N         exits with code N
//	kill           ends as if killed by SIGKILL
//	cat            copies stdin (or terminal input) to stdout until stdin
//	               is closed (or, on a terminal, Ctrl-D arrives), then exits 0
//	sleep          runs until it gets a signal, which ends it
//	whoami         prints the user (Basic auth name, default "user")
//	pwd            prints the working directory
//	env            prints the request's env vars, sorted, as K=V lines
//	size           prints the terminal size as "COLS ROWS", or "no tty"
//
// Anything else fails with invalid_argument, like a missing executable.
type Agent struct {
	processconnect.UnimplementedProcessHandler
	filesystemconnect.UnimplementedFilesystemHandler

	mux *http.ServeMux

	mu sync.Mutex
	// +checklocks:mu
	requests []Request
	// +checklocks:mu
	procs map[uint32]*fakeProc
	// +checklocks:mu
	nextPID uint32
	// +checklocks:mu
	files map[string][]byte
	// +checklocks:mu
	dirs map[string]bool
}

type fakeProc struct {
	pid     uint32
	info    *process.ProcessInfo
	pty     *process.PTY_Size
	stdin   chan []byte // closed by CloseStdin
	closed  bool
	signals chan process.Signal
	resize  chan *process.PTY_Size
	done    chan struct{}
	end     *process.ProcessEvent_EndEvent
}

// NewAgent returns a fake agent whose filesystem holds /, /tmp, /root and
// /home/user.
func NewAgent() *Agent {
	a := &Agent{
		procs:   map[uint32]*fakeProc{},
		nextPID: 100,
		files:   map[string][]byte{},
		dirs:    map[string]bool{"/": true, "/tmp": true, "/root": true, "/home": true, "/home/user": true},
	}
	a.mux = http.NewServeMux()
	a.mux.Handle(processconnect.NewProcessHandler(a))
	a.mux.Handle(filesystemconnect.NewFilesystemHandler(a))
	a.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	a.mux.HandleFunc("GET /files", a.readFile)
	a.mux.HandleFunc("POST /files", a.writeFile)
	return a
}

// ServeHTTP implements http.Handler.
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.URL.Path == "/files" {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
	}
	a.mu.Lock()
	a.requests = append(a.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone(), Body: body})
	a.mu.Unlock()
	a.mux.ServeHTTP(w, r)
}

// Requests returns the requests received so far.
func (a *Agent) Requests() []Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.requests)
}

// File returns the content of a file in the fake filesystem.
func (a *Agent) File(p string) ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.files[p]
	return b, ok
}

// PutFile stores a file in the fake filesystem, with its parents.
func (a *Agent) PutFile(p string, data []byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mkdirAllLocked(path.Dir(p))
	a.files[p] = data
}

// userOf returns the user selected by Basic auth, or the default "user".
func userOf(h http.Header) string {
	r := http.Request{Header: h}
	if u, _, ok := r.BasicAuth(); ok && u != "" {
		return u
	}
	return "user"
}

func home(user string) string {
	if user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// resolve makes p absolute the way envd does: relative to the user's home.
func resolve(p, user string) string {
	if p == "" {
		return home(user)
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = home(user) + p[1:]
	}
	if !path.IsAbs(p) {
		p = home(user) + "/" + p
	}
	return path.Clean(p)
}

// Start implements processconnect.ProcessHandler.
func (a *Agent) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	m := req.Msg
	argv := append([]string{m.GetProcess().GetCmd()}, m.GetProcess().GetArgs()...)
	switch argv[0] {
	case "echo", "printerr", "exit", "kill", "cat", "sleep", "whoami", "pwd", "env", "size":
	default:
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("executable %q not found", argv[0]))
	}
	user := userOf(req.Header())
	a.mu.Lock()
	a.nextPID++
	p := &fakeProc{
		pid:     a.nextPID,
		info:    &process.ProcessInfo{Config: m.GetProcess(), Pid: a.nextPID, Tag: m.Tag},
		stdin:   make(chan []byte, 64),
		signals: make(chan process.Signal, 4),
		resize:  make(chan *process.PTY_Size, 4),
		done:    make(chan struct{}),
	}
	if m.GetPty() != nil {
		p.pty = m.GetPty().GetSize()
	}
	if !m.GetStdin() && p.pty == nil {
		p.closed = true
		close(p.stdin)
	}
	a.procs[p.pid] = p
	a.mu.Unlock()

	send := func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	}
	out := func(stderr bool, b []byte) error {
		d := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: b}}
		if p.pty != nil {
			d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: b}
		} else if stderr {
			d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: b}
		}
		return send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}})
	}
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	end := a.run(ctx, p, argv, user, m, out)
	a.mu.Lock()
	p.end = end
	delete(a.procs, p.pid)
	a.mu.Unlock()
	close(p.done)
	return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
}

func exited(code int) *process.ProcessEvent_EndEvent {
	return &process.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: "exit status " + strconv.Itoa(code)}
}

func signaled(name string) *process.ProcessEvent_EndEvent {
	return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: "signal: " + name}
}

func sigName(s process.Signal) string {
	switch s {
	case process.Signal_SIGNAL_SIGKILL:
		return "killed"
	case process.Signal_SIGNAL_SIGTERM:
		return "terminated"
	case 2:
		return "interrupt"
	}
	return "signal " + strconv.Itoa(int(s))
}

// run simulates one built-in command.
func (a *Agent) run(ctx context.Context, p *fakeProc, argv []string, user string, m *process.StartRequest, out func(bool, []byte) error) *process.ProcessEvent_EndEvent {
	switch argv[0] {
	case "echo", "printerr":
		out(argv[0] == "printerr", []byte(strings.Join(argv[1:], " ")+"\n"))
	case "exit":
		n, _ := strconv.Atoi(argv[len(argv)-1])
		return exited(n)
	case "kill":
		return signaled("killed")
	case "whoami":
		out(false, []byte(user+"\n"))
	case "pwd":
		out(false, []byte(resolve(m.GetProcess().GetCwd(), user)+"\n"))
	case "env":
		var lines []string
		for k, v := range m.GetProcess().GetEnvs() {
			lines = append(lines, k+"="+v+"\n")
		}
		sort.Strings(lines)
		out(false, []byte(strings.Join(lines, "")))
	case "size":
		if p.pty == nil {
			out(false, []byte("no tty\n"))
		} else {
			out(false, fmt.Appendf(nil, "%d %d\n", p.pty.GetCols(), p.pty.GetRows()))
		}
	case "cat":
		for {
			select {
			case b, ok := <-p.stdin:
				if !ok {
					return exited(0)
				}
				if i := bytes.IndexByte(b, 0x04); p.pty != nil && i >= 0 { // Ctrl-D on a terminal
					if i > 0 {
						out(false, b[:i])
					}
					return exited(0)
				}
				out(false, b)
			case s := <-p.signals:
				return signaled(sigName(s))
			case <-ctx.Done():
				return signaled("killed")
			}
		}
	case "sleep":
		select {
		case s := <-p.signals:
			return signaled(sigName(s))
		case <-ctx.Done():
			return signaled("killed")
		}
	}
	return exited(0)
}

func (a *Agent) proc(sel *process.ProcessSelector) (*fakeProc, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.procs[sel.GetPid()]; p != nil {
		return p, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", sel.GetPid()))
}

// Connect implements processconnect.ProcessHandler. It reports the start
// and the end of the process, not its output.
func (a *Agent) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, err := a.proc(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	if err := stream.Send(&process.ConnectResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}}); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	a.mu.Lock()
	end := p.end
	a.mu.Unlock()
	return stream.Send(&process.ConnectResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}})
}

// List implements processconnect.ProcessHandler.
func (a *Agent) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &process.ListResponse{}
	for _, p := range a.procs {
		resp.Processes = append(resp.Processes, p.info)
	}
	slices.SortFunc(resp.Processes, func(x, y *process.ProcessInfo) int { return int(x.Pid) - int(y.Pid) })
	return connect.NewResponse(resp), nil
}

// SendInput implements processconnect.ProcessHandler.
func (a *Agent) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := a.proc(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	in := req.Msg.GetInput()
	data := in.GetStdin()
	if p.pty != nil {
		if in.GetPty() == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process has a tty: send pty input"))
		}
		data = in.GetPty()
	} else if in.GetPty() != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process has no tty"))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.closed {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("stdin is closed"))
	}
	p.stdin <- data
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// CloseStdin implements processconnect.ProcessHandler.
func (a *Agent) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := a.proc(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("cannot close stdin of a tty process"))
	}
	if !p.closed {
		p.closed = true
		close(p.stdin)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// SendSignal implements processconnect.ProcessHandler.
func (a *Agent) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	p, err := a.proc(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	select {
	case p.signals <- req.Msg.GetSignal():
	default:
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// Update implements processconnect.ProcessHandler.
func (a *Agent) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := a.proc(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if p.pty == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process has no tty"))
	}
	p.pty = req.Msg.GetPty().GetSize()
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// --- filesystem ---

// +checklocks:a.mu
func (a *Agent) mkdirAllLocked(p string) {
	for ; p != "/" && p != "."; p = path.Dir(p) {
		a.dirs[p] = true
	}
}

// +checklocks:a.mu
func (a *Agent) entryLocked(p string) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{Name: path.Base(p), Path: p, Owner: "user", Group: "user", ModifiedTime: timestamppb.New(epoch)}
	switch b, isFile := a.files[p]; {
	case isFile:
		e.Type, e.Size, e.Mode, e.Permissions = filesystem.FileType_FILE_TYPE_FILE, int64(len(b)), 0o644, "-rw-r--r--"
	case a.dirs[p]:
		e.Type, e.Mode, e.Permissions = filesystem.FileType_FILE_TYPE_DIRECTORY, 0o755, "drwxr-xr-x"
	default:
		return nil
	}
	return e
}

func notFound(p string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s not found", p))
}

// Stat implements filesystemconnect.FilesystemHandler.
func (a *Agent) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	p := resolve(req.Msg.GetPath(), userOf(req.Header()))
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.entryLocked(p)
	if e == nil {
		return nil, notFound(p)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// ListDir implements filesystemconnect.FilesystemHandler (depth 1 only).
func (a *Agent) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	p := resolve(req.Msg.GetPath(), userOf(req.Header()))
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.dirs[p] {
		if _, ok := a.files[p]; ok {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is not a directory", p))
		}
		return nil, notFound(p)
	}
	var names []string
	for f := range a.files {
		if path.Dir(f) == p {
			names = append(names, f)
		}
	}
	for d := range a.dirs {
		if d != p && path.Dir(d) == p {
			names = append(names, d)
		}
	}
	sort.Strings(names)
	resp := &filesystem.ListDirResponse{}
	for _, n := range names {
		resp.Entries = append(resp.Entries, a.entryLocked(n))
	}
	return connect.NewResponse(resp), nil
}

// MakeDir implements filesystemconnect.FilesystemHandler.
func (a *Agent) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	p := resolve(req.Msg.GetPath(), userOf(req.Header()))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.dirs[p] {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
	}
	if _, ok := a.files[p]; ok {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s is a file", p))
	}
	a.mkdirAllLocked(p)
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: a.entryLocked(p)}), nil
}

// Remove implements filesystemconnect.FilesystemHandler.
func (a *Agent) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	p := resolve(req.Msg.GetPath(), userOf(req.Header()))
	a.mu.Lock()
	defer a.mu.Unlock()
	for f := range a.files {
		if f == p || strings.HasPrefix(f, p+"/") {
			delete(a.files, f)
		}
	}
	for d := range a.dirs {
		if d == p || strings.HasPrefix(d, p+"/") {
			delete(a.dirs, d)
		}
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// Move implements filesystemconnect.FilesystemHandler (files only).
func (a *Agent) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	user := userOf(req.Header())
	src, dst := resolve(req.Msg.GetSource(), user), resolve(req.Msg.GetDestination(), user)
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.files[src]
	if !ok {
		return nil, notFound(src)
	}
	delete(a.files, src)
	a.mkdirAllLocked(path.Dir(dst))
	a.files[dst] = b
	return connect.NewResponse(&filesystem.MoveResponse{Entry: a.entryLocked(dst)}), nil
}

func (a *Agent) readFile(w http.ResponseWriter, r *http.Request) {
	p := resolve(r.URL.Query().Get("path"), r.URL.Query().Get("username"))
	a.mu.Lock()
	b, ok := a.files[p]
	isDir := a.dirs[p]
	a.mu.Unlock()
	switch {
	case isDir:
		writeError(w, http.StatusBadRequest, "path is a directory")
	case !ok:
		writeError(w, http.StatusNotFound, fmt.Sprintf("path %s does not exist", p))
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}
}

func (a *Agent) writeFile(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); ct != "application/octet-stream" {
		writeError(w, http.StatusBadRequest, "unsupported content type "+ct)
		return
	}
	q := r.URL.Query()
	if q.Get("path") == "" {
		writeError(w, http.StatusBadRequest, "path is required")
		return
	}
	p := resolve(q.Get("path"), q.Get("username"))
	b, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	a.mu.Lock()
	if a.dirs[p] {
		a.mu.Unlock()
		writeError(w, http.StatusBadRequest, "path is a directory")
		return
	}
	a.mkdirAllLocked(path.Dir(p))
	a.files[p] = b
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, []map[string]string{{"path": p, "name": path.Base(p), "type": "file"}})
}
