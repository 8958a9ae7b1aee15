package api

import "time"

// SandboxLog is one element of SandboxLogs.Logs.
type SandboxLog struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// SandboxLogEntry is one structured log entry of a sandbox.
type SandboxLogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"` // debug, info, warn, error
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// SandboxLogs is GET /sandboxes/{id}/logs (deprecated by E2B, still read
// by older CLIs).
type SandboxLogs struct {
	Logs       []SandboxLog      `json:"logs"`
	LogEntries []SandboxLogEntry `json:"logEntries"`
}

// SandboxLogsV2 is GET /v2/sandboxes/{id}/logs.
type SandboxLogsV2 struct {
	Logs []SandboxLogEntry `json:"logs"`
}
