package client

import (
	"encoding/base64"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/fencesandbox/fence/api/envd/filesystem/filesystemconnect"
	"github.com/fencesandbox/fence/api/envd/process/processconnect"
)

// keepalivePingInterval is the Keepalive-Ping-Interval (seconds) sent on
// streams, as the SDKs do: the agent sends a keepalive event after that
// much silence.
const keepalivePingInterval = "50"

// Envd is a client of one sandbox's agent (envd's protocol). Create one with
// NewEnvd or Sandbox.Envd.
type Envd struct {
	hc      *http.Client
	baseURL string
	headers http.Header // sent on every request
	user    string      // "" = the agent's default user
	proc    processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
}

// NewEnvd returns a client of the agent at baseURL reached through hc, which
// sends headers on every request. hc must not set a Timeout (it would cut
// process streams); bound calls with contexts instead.
//
// Through the daemon, headers carry E2b-Sandbox-Id, E2b-Sandbox-Port and
// X-Access-Token (Sandbox.Envd sets them). Over a direct connection to an
// agent (fence run), headers may be nil and baseURL any http URL whose
// host hc's transport ignores, e.g. "http://agent".
func NewEnvd(hc *http.Client, baseURL string, headers http.Header) *Envd {
	baseURL = strings.TrimRight(baseURL, "/")
	return &Envd{
		hc:      hc,
		baseURL: baseURL,
		headers: headers.Clone(),
		proc:    processconnect.NewProcessClient(hc, baseURL, connect.WithProtoJSON()),
		fs:      filesystemconnect.NewFilesystemClient(hc, baseURL, connect.WithProtoJSON()),
	}
}

// WithUser returns a copy of e that acts as user: processes run as that user
// and file operations use its permissions and home directory. "" selects the
// agent's default user.
func (e *Envd) WithUser(user string) *Envd {
	c := *e
	c.user = user
	return &c
}

// setHeaders adds e's headers and the user selection to h. user overrides
// e's user when not empty.
func (e *Envd) setHeaders(h http.Header, user string) {
	for k, vs := range e.headers {
		h[k] = append([]string(nil), vs...)
	}
	if user == "" {
		user = e.user
	}
	if user != "" {
		h.Set("Authorization", basicUser(user))
	}
}

// basicUser is the Authorization value that selects user in envd: Basic
// auth with the user name and an empty password.
func basicUser(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

// request wraps msg in a Connect request carrying e's headers.
func request[T any](e *Envd, msg *T, user string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	e.setHeaders(r.Header(), user)
	return r
}
