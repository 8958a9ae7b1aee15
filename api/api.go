// Package api holds fence's wire contract for the control plane: the JSON
// shapes of E2B's REST API (which fence serves unchanged so the official e2b
// SDKs work), fence's error codes, and the rules every side of the wire
// reads alike: which requests are sandbox traffic and to where
// (SandboxTarget), the shape of a sandbox ID, and listing page tokens.
// It links the standard library alone (its envd subpackages add their
// generated code's runtime).
//
// Field names and status codes are API: the e2b SDKs read them literally.
// Change them only with a test
// that shows the SDK still works.
package api

import (
	"encoding/json"
	"time"
)

// EnvdPort is the port the E2B SDKs address the in-sandbox agent (envd) on.
const EnvdPort = 49983

// EnvdVersion is the envd version fence's agent advertises. The SDKs gate
// features on it; 0.6.13 enables all of them.
const EnvdVersion = "0.6.13"

// ClientID is the constant E2B returns in the deprecated clientID field,
// which the Python SDK requires.
const ClientID = "6532622b"

// Header names used between the SDKs and fence.
const (
	HeaderAPIKey       = "X-API-Key"
	HeaderSandboxID    = "E2b-Sandbox-Id"
	HeaderSandboxPort  = "E2b-Sandbox-Port"
	HeaderAccessToken  = "X-Access-Token"
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
	HeaderNextToken    = "X-Next-Token"
)

// NewSandbox is the body of POST /sandboxes and POST /v2/sandboxes.
type NewSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int32            `json:"timeout,omitempty"` // seconds
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	AutoPause  *bool             `json:"autoPause,omitempty"`
	// AutoPauseMemory false asks for a filesystem-only auto-pause: the
	// resume reboots the sandbox on its files.
	AutoPauseMemory     *bool          `json:"autoPauseMemory,omitempty"`
	AutoResume          *AutoResume    `json:"autoResume,omitempty"`
	Secure              *bool          `json:"secure,omitempty"`
	AllowInternetAccess *bool          `json:"allow_internet_access,omitempty"`
	Network             *NetworkConfig `json:"network,omitempty"`
	// fence extensions (ignored by E2B's SDKs, which never send them).
	// Secrets binds stored secrets to environment variables: the sandbox
	// sees a random placeholder in each variable, and the egress gateway
	// swaps it for the real value only in the allowed places of requests
	// to the bound hosts. Keyed by the variable's name.
	Secrets  map[string]SecretBinding `json:"secrets,omitempty"`
	CPUCount *float64                 `json:"cpuCount,omitempty"`
	MemoryMB *int64                   `json:"memoryMB,omitempty"`
	DiskMB   *int64                   `json:"diskSizeMB,omitempty"`
	// VolumeMounts mounts the team's volumes, by name (see VolumeMount).
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
	// AutoCheckpoint checkpoints the sandbox's filesystem before every
	// command it runs, so that a step can be rewound.
	AutoCheckpoint *bool `json:"autoCheckpoint,omitempty"`
	// MCP is E2B's `mcp` option, which the SDKs send as given and then pass
	// to the sandbox's mcp-gateway command. fence reads one thing in it: a
	// server's "secrets", bindings shaped as Secrets, which join the
	// sandbox's (see docs/MCP.md).
	MCP json.RawMessage `json:"mcp,omitempty"`
	// Lifecycle holds fence's lifecycle extensions (E2B's lifecycle
	// options arrive as autoPause, autoPauseMemory and autoResume).
	Lifecycle *NewLifecycle `json:"lifecycle,omitempty"`
}

// NewLifecycle is fence's lifecycle extensions at create.
type NewLifecycle struct {
	// IdleTimeout pauses the sandbox, with its memory, once it has had no
	// traffic, no SSH session and no CPU use for that many seconds; the
	// next traffic resumes it, and the time paused does not count against
	// its timeout. 0 never; absent takes the daemon's --idle-pause.
	IdleTimeout *int64 `json:"idleTimeout,omitempty"`
}

// AutoResume is E2B's auto-resume policy: traffic to a paused sandbox
// resumes it.
type AutoResume struct {
	Enabled bool `json:"enabled"`
}

// Lifecycle is what a sandbox does at its deadline (GET /sandboxes/{id}).
type Lifecycle struct {
	OnTimeout  string `json:"onTimeout"` // "kill" | "pause"
	AutoResume bool   `json:"autoResume"`
	// IdleTimeout is fence's idle timeout in seconds; absent: none.
	IdleTimeout int64 `json:"idleTimeout,omitempty"`
}

// NetworkConfig is E2B's SandboxNetworkConfig, with fence's additions.
type NetworkConfig struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// Rules are E2B's header transforms, keyed by host ("api.example.com"
	// or "*.example.com"); values may hold ${e2b.secrets.NAME}.
	Rules map[string][]NetworkRule `json:"rules,omitempty"`
	// EgressProxy tunnels the sandbox's allowed TCP flows through a
	// SOCKS5 proxy. Its password is never returned.
	EgressProxy        *EgressProxy `json:"egressProxy,omitempty"`
	AllowPublicTraffic *bool        `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    string       `json:"maskRequestHost,omitempty"`
	// fence extensions.
	// Inspect makes the egress gateway terminate every name-allowed TLS
	// flow and decide each request on its own Host/:authority; nil takes
	// the daemon's default (fence serve --inspect).
	Inspect *bool `json:"inspect,omitempty"`
	// Passthrough names hosts ("example.com", "*.example.com") the gateway
	// never intercepts, even under Inspect: certificate pinning and mutual
	// TLS keep working there, and no rule or secret applies to them.
	Passthrough []string `json:"passthrough,omitempty"`
	// Approval "ask" holds a lookup of a name the sandbox may not reach
	// until a person decides on it (GET /approvals, POST /approvals/{id});
	// "" (the default) refuses it at once.
	Approval string `json:"approval,omitempty"`
}

// NetworkRule is one entry of NetworkConfig.Rules.
type NetworkRule struct {
	Transform *NetworkTransform `json:"transform,omitempty"`
}

// NetworkTransform rewrites matching outbound requests.
type NetworkTransform struct {
	// Headers are set on (or replace same-named headers of) each request.
	Headers map[string]string `json:"headers,omitempty"`
}

// EgressProxy is E2B's bring-your-own SOCKS5 egress proxy.
type EgressProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// SecretBinding is fence's placeholder binding of one stored secret.
type SecretBinding struct {
	// Secret is the stored secret's name or sec_ ID.
	Secret string `json:"secret"`
	// Hosts are the hosts ("api.example.com", "*.example.com") whose
	// requests may carry the real value.
	Hosts []string `json:"hosts"`
	// Places are where in a request the placeholder is replaced: "header"
	// (the default), "query", "basicAuth".
	Places []string `json:"places,omitempty"`
}

// NetworkUpdate is the body of PUT /sandboxes/{id}/network (E2B's
// SandboxNetworkUpdateConfig). It replaces the whole egress configuration:
// an omitted field is cleared.
type NetworkUpdate struct {
	AllowOut            []string                 `json:"allowOut,omitempty"`
	DenyOut             []string                 `json:"denyOut,omitempty"`
	Rules               map[string][]NetworkRule `json:"rules,omitempty"`
	EgressProxy         *EgressProxy             `json:"egressProxy,omitempty"`
	AllowInternetAccess *bool                    `json:"allow_internet_access,omitempty"`
	Inspect             *bool                    `json:"inspect,omitempty"`
	Passthrough         []string                 `json:"passthrough,omitempty"`
}

// Sandbox is the create/connect response.
type Sandbox struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	Alias              string  `json:"alias,omitempty"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// ListedSandbox is one element of GET /sandboxes and GET /v2/sandboxes.
type ListedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	ClientID    string            `json:"clientID"`
	Alias       string            `json:"alias,omitempty"`
	CPUCount    float64           `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	EnvdVersion string            `json:"envdVersion"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	State       string            `json:"state"` // "running" | "paused"
	Metadata    map[string]string `json:"metadata,omitempty"`
	// VolumeMounts are the volumes it mounts (see NewSandbox).
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
}

// SandboxDetail is GET /sandboxes/{id}.
type SandboxDetail struct {
	ListedSandbox
	AllowInternetAccess *bool          `json:"allowInternetAccess"`
	Domain              *string        `json:"domain"`
	EnvdAccessToken     string         `json:"envdAccessToken,omitempty"`
	Network             *NetworkConfig `json:"network,omitempty"`
	Lifecycle           *Lifecycle     `json:"lifecycle,omitempty"`
}

// TimeoutRequest is POST /sandboxes/{id}/timeout.
type TimeoutRequest struct {
	Timeout int32 `json:"timeout"`
}

// ConnectRequest is POST /sandboxes/{id}/connect (v1 requires timeout, v2 not).
type ConnectRequest struct {
	Timeout *int32 `json:"timeout,omitempty"`
	// Memory false asks for a cold boot instead of a memory restore.
	Memory *bool `json:"memory,omitempty"`
}

// PauseRequest is the optional body of POST /sandboxes/{id}/pause.
type PauseRequest struct {
	// Memory false asks for a filesystem-only pause (the resume reboots).
	Memory *bool `json:"memory,omitempty"`
}

// ResumeRequest is POST /sandboxes/{id}/resume (E2B's older route; connect
// replaced it).
type ResumeRequest struct {
	Timeout   *int32 `json:"timeout,omitempty"` // seconds; 15 when absent
	AutoPause *bool  `json:"autoPause,omitempty"`
	Memory    *bool  `json:"memory,omitempty"`
}

// RefreshRequest is POST /sandboxes/{id}/refreshes.
type RefreshRequest struct {
	Duration *int32 `json:"duration,omitempty"`
}

// SandboxMetric is one element of GET /sandboxes/{id}/metrics.
type SandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      float64   `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
	// EgressBytesOut and EgressBytesIn (fence) are the bytes the sandbox's
	// network flows sent and received up to this reading, counted as each
	// flow ends.
	EgressBytesOut int64 `json:"egressBytesOut"`
	EgressBytesIn  int64 `json:"egressBytesIn"`
}

// SandboxesWithMetrics is the body of GET /sandboxes/metrics: the latest
// reading of each sandbox named that has one, keyed by sandbox ID.
type SandboxesWithMetrics struct {
	Sandboxes map[string]SandboxMetric `json:"sandboxes"`
}

// Error is E2B's error body. The SDKs read Code from the body, not the status.
type Error struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code,omitempty"`
}

// ProxyError is the body of the 502 fence answers for sandbox traffic to an
// unknown or stopped sandbox.
type ProxyError struct {
	SandboxID string `json:"sandboxId"`
	Message   string `json:"message"`
	Code      int    `json:"code"`
}
