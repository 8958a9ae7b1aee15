// Package gateway is fence's egress gateway: it terminates the TLS flows
// of a sandbox that it must see inside (hosts with header rules or bound
// secrets, package registries, and every name-allowed host under
// inspection), decides every HTTP/1.1 request and every HTTP/2 stream on
// its own Host/:authority, puts secrets into requests only on their way to
// the hosts they are bound to, and records what it decides and what
// packages a sandbox downloads.
//
// # Guarantees
//
//   - The CA's key never leaves the daemon's data directory (0600); a
//     sandbox only ever sees the CA certificate.
//   - An intercepted connection reaches only the destination the egress
//     policy allowed (the flow's Dst), with the SNI's name; every request
//     on it must name that same host, and is decided again against the
//     sandbox's current policy.
//   - Upstream TLS is verified against the host's roots (or the operator's
//     bundle); an upstream that fails verification gets no request.
//   - A secret's value is put only into the places its rule or binding
//     allows, of requests to its hosts (a binding's: on the port it names,
//     or the scheme's); a placeholder anywhere else is refused and
//     recorded. Responses (informational 1xx ones, 101s and trailers
//     included) that echo an injected value, or come from a host a
//     binding names (on any port, either scheme), reach the sandbox with
//     the value masked, and a field whose name holds it dropped. The
//     sandbox cannot choose how such an answer is cut or coded: Range,
//     If-Range and Want-*Digest are dropped on the way there, a 206 or
//     multipart/byteranges answer is refused, digest fields of the
//     answer are dropped, and a body under a content coding the gateway
//     cannot undo is refused, never passed on unscanned.
//   - Redirects are never followed by the gateway.
//   - Every decision and every secret use is an [Event]; values never are.
//   - A download is recorded only when its whole body reached the sandbox.
//
// # What it does not do
//
// It does not look at bytes after a WebSocket 101, at flows it passes
// through (Passthrough names, and hosts without rules when the sandbox
// has no bindings and does not inspect: there only the SNI is checked),
// or at placeholders the sandbox encodes (base64 in a body): those
// are only placeholders, worthless outside. Masking catches values echoed
// verbatim or JSON-, percent- or Basic-encoded, not transformed ones.
// docs/GATEWAY.md has the details.
package gateway

import (
	"context"
	"time"

	"github.com/fencesandbox/fence/internal/egress/policy"
)

// Config is what the gateway knows about one sandbox. It is read again
// for every request, so a change (PUT network, a rotated secret) applies
// to the sandbox's next request.
type Config struct {
	// Policy decides each request's host.
	Policy *policy.Policy
	// Rules are the header transforms, keyed by host pattern
	// ("api.example.com", "*.example.com"): header name → value, where a
	// value may hold ${e2b.secrets.NAME}. An exact key beats a wildcard,
	// and the longest wildcard suffix wins; rule sets are not merged.
	Rules map[string]map[string]string
	// Bindings are the sandbox's secret placeholders.
	Bindings []Binding
	// Inspect intercepts every name-allowed TLS flow, not only those the
	// rules, bindings and package registries need.
	Inspect bool
	// Passthrough are host patterns never intercepted.
	Passthrough []string
}

// Place is where in a request a placeholder may be replaced.
type Place uint8

// Places a binding allows.
const (
	PlaceHeader    Place = 1 << iota // any request header value
	PlaceQuery                       // a query parameter value
	PlaceBasicAuth                   // the password (or user) of Basic credentials
)

// Binding binds one stored secret to a placeholder the sandbox sees.
type Binding struct {
	Env         string // the variable that holds the placeholder
	Secret      string // the stored secret's name
	Placeholder string // random, per sandbox
	// Hosts are name patterns, each optionally with a port
	// ("api.example.com:8443"); without one it means the scheme's port
	// (443 for https, 80 for http).
	Hosts  []string
	Places Place
}

// Secrets gives a stored secret's current value by name.
type Secrets interface {
	Value(ctx context.Context, name string) (string, error)
}

// Event is one request the gateway decided.
type Event struct {
	SandboxID string
	Time      time.Time
	Host      string
	Method    string
	Path      string // without the query
	Allowed   bool
	Reason    string   // why it was refused, or "" when allowed
	Secrets   []string // names of the secrets put into it; never values
	Status    int      // upstream's status, 0 if none
	BytesOut  int64
	BytesIn   int64
}

// Download is one package artifact a sandbox fetched from a registry.
type Download struct {
	SandboxID string
	Time      time.Time
	Ecosystem string // "pypi", "npm", "debian", "go", "crates", "github"
	Name      string
	Version   string
	URL       string
	Size      int64  // bytes delivered to the sandbox
	SHA256    string // hex, of the bytes delivered
}

// Recorder receives the gateway's events.
type Recorder interface {
	Request(ctx context.Context, ev Event)
	Download(ctx context.Context, d Download)
}
