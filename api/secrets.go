package api

import "time"

// Secret is a stored secret as GET/POST /secrets return it. It never holds
// the value: values are write-only.
type Secret struct {
	SecretID       string            `json:"secretID"` // "sec_" + 26 characters
	Name           string            `json:"name"`     // canonical, lower case
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"` // always present, {} if empty
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

// NewSecret is the body of POST /secrets.
type NewSecret struct {
	Name     string            `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SecretUpdate is the body of POST /secrets/{secretID}: a new value, and
// metadata that replaces the stored one when present (even {}); absent or
// null keeps it.
type SecretUpdate struct {
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

// The fixed messages of the /secrets routes' errors; they never echo the
// request.
const (
	SecretMsgInvalid  = "Invalid secrets request"
	SecretMsgNotFound = "Secret not found"
	SecretMsgConflict = "Secret cannot be modified in its current state"
	SecretMsgBackend  = "Secrets backend error"
	SecretMsgTimeout  = "Secrets backend timed out"
)

// Download is one package artifact a sandbox fetched through the egress
// gateway, as GET /sandboxes/{id}/downloads returns it.
type Download struct {
	Ecosystem string    `json:"ecosystem"` // "pypi", "npm", "debian", "go", "crates", "github"
	Name      string    `json:"name"`
	Version   string    `json:"version"`
	URL       string    `json:"url"`
	Size      int64     `json:"size"`   // bytes delivered to the sandbox
	SHA256    string    `json:"sha256"` // hex of the bytes delivered; "" if unknown
	Time      time.Time `json:"time"`
}
