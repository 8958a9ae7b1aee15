package api

import "time"

// ApprovalRequest is a sandbox's held lookup of a name its policy does not
// allow, waiting for a decision (fence extension: GET /approvals, network
// approval "ask").
type ApprovalRequest struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandboxID"`
	Name      string    `json:"name"`
	Created   time.Time `json:"created"`
	Deadline  time.Time `json:"deadline"`
	// Decision (once, sandbox, team, deny or timeout) and Actor are set
	// once it is decided.
	Decision string `json:"decision,omitempty"`
	Actor    string `json:"actor,omitempty"`
}

// ApprovalDecision is the body of POST /approvals/{id}: once (this lookup
// proceeds), sandbox (the name joins the sandbox's allowOut), team (the
// name is allowed team-wide; refused until fence keeps team-wide names)
// or deny.
type ApprovalDecision struct {
	Decision string `json:"decision"`
}
