package api

import "time"

// IdentifierMask shows enough of an API key or access token to tell it
// apart, never the key: its prefix, the length of the rest, and the rest's
// first 2 and last 4 characters.
type IdentifierMask struct {
	Prefix            string `json:"prefix"`
	ValueLength       int    `json:"valueLength"`
	MaskedValuePrefix string `json:"maskedValuePrefix"`
	MaskedValueSuffix string `json:"maskedValueSuffix"`
}

// TeamUser names who created a key: the ID of the credential used.
type TeamUser struct {
	ID    string  `json:"id"`
	Email *string `json:"email"`
}

// TeamAPIKey is an API key as GET /api-keys lists it.
type TeamAPIKey struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Mask      IdentifierMask `json:"mask"`
	CreatedAt time.Time      `json:"createdAt"`
	CreatedBy *TeamUser      `json:"createdBy"`
	LastUsed  *time.Time     `json:"lastUsed"`
	// Role is fence's: "auditor" for a key that reads its team's audit
	// trail, usage, metrics and lists alone; absent for a full key.
	Role string `json:"role,omitempty"`
}

// CreatedTeamAPIKey is a new API key: the only answer with its value.
type CreatedTeamAPIKey struct {
	TeamAPIKey
	Key string `json:"key"`
}

// NewTeamAPIKey is the body of POST /api-keys, PATCH /api-keys/{id} and
// POST /access-tokens.
type NewTeamAPIKey struct {
	Name string `json:"name"`
	// Role is fence's, for POST /api-keys: "auditor", or empty.
	Role string `json:"role,omitempty"`
}

// AccessToken is an access token as fence lists it (GET /access-tokens).
type AccessToken struct {
	ID        string         `json:"id"`
	Name      string         `json:"name"`
	Mask      IdentifierMask `json:"mask"`
	CreatedAt time.Time      `json:"createdAt"`
}

// CreatedAccessToken is a new access token: the only answer with its
// value.
type CreatedAccessToken struct {
	AccessToken
	Token string `json:"token"`
}

// Team is an item of GET /teams: the caller's team, with a new API key.
type Team struct {
	TeamID    string `json:"teamID"`
	Name      string `json:"name"`
	APIKey    string `json:"apiKey"`
	IsDefault bool   `json:"isDefault"`
}

// TeamInfo is a team as the admin routes show it (GET and POST
// /admin/teams).
type TeamInfo struct {
	TeamID    string    `json:"teamID"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
}

// NewTeam is the body of POST /admin/teams.
type NewTeam struct {
	Name string `json:"name"`
}

// KilledSandboxes is the answer of POST /admin/teams/{teamID}/sandboxes/kill.
type KilledSandboxes struct {
	KilledCount int `json:"killedCount"`
	FailedCount int `json:"failedCount"`
}
