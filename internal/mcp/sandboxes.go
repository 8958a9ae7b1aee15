package mcp

import (
	"context"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// DefaultTemplate is create_sandbox's template when none is named.
const DefaultTemplate = "base"

// allTraffic in a deny list makes the allow list an allowlist.
const allTraffic = "0.0.0.0/0"

// SecretBinding binds a stored secret to an environment variable.
type SecretBinding struct {
	Secret string   `json:"secret" jsonschema:"the stored secret's name (fence secret create) or sec_ ID"`
	Hosts  []string `json:"hosts" jsonschema:"hosts (api.example.com or *.example.com) whose requests may carry the real value; the sandbox only ever sees a placeholder"`
	Places []string `json:"places,omitempty" jsonschema:"where in a request the placeholder is replaced: header (the default), query, basicAuth"`
}

// CreateInput is create_sandbox's input.
type CreateInput struct {
	Template       string                   `json:"template,omitempty" jsonschema:"template name or ID (default base)"`
	TimeoutSeconds float64                  `json:"timeout_seconds,omitempty" jsonschema:"seconds the sandbox lives before it is killed (default: the daemon's, 300)"`
	AllowOut       []string                 `json:"allow_out,omitempty" jsonschema:"egress allowlist: hosts (example.com, *.example.com), IPs or CIDRs the sandbox may reach; everything else is denied. Without allow_out and deny_out all egress is denied (unless the daemon runs with --allow-internet)"`
	DenyOut        []string                 `json:"deny_out,omitempty" jsonschema:"IPs or CIDRs to block; without allow_out, everything else is reachable; allow_out wins over deny_out"`
	Secrets        map[string]SecretBinding `json:"secrets,omitempty" jsonschema:"stored secrets to bind, keyed by the environment variable that holds the placeholder"`
	Env            map[string]string        `json:"env,omitempty" jsonschema:"environment variables of every process of the sandbox"`
	Metadata       map[string]string        `json:"metadata,omitempty" jsonschema:"key/value labels, returned by list_sandboxes and usable as its filter"`
}

// SandboxOutput describes a sandbox.
type SandboxOutput struct {
	SandboxID  string            `json:"sandbox_id"`
	TemplateID string            `json:"template_id,omitempty"`
	State      string            `json:"state,omitempty"`
	StartedAt  string            `json:"started_at,omitempty"`
	EndAt      string            `json:"end_at,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

func (t *tools) create(ctx context.Context, _ *sdk.CallToolRequest, in CreateInput) (SandboxOutput, error) {
	req := api.NewSandbox{TemplateID: in.Template, Metadata: in.Metadata, EnvVars: in.Env}
	if strings.TrimSpace(req.TemplateID) == "" {
		req.TemplateID = DefaultTemplate
	}
	if in.TimeoutSeconds != 0 {
		d, err := seconds("timeout_seconds", in.TimeoutSeconds, 0)
		if err != nil {
			return SandboxOutput{}, err
		}
		s := int32(max(1, d/time.Second))
		req.Timeout = &s
	}
	if len(in.AllowOut) > 0 || len(in.DenyOut) > 0 {
		req.Network = &api.NetworkConfig{AllowOut: in.AllowOut, DenyOut: in.DenyOut}
		if len(in.AllowOut) > 0 && !slices.Contains(in.DenyOut, allTraffic) {
			// allow_out is an allowlist: E2B's recipe for one.
			req.Network.DenyOut = append(slices.Clone(in.DenyOut), allTraffic)
		}
	}
	if len(in.Secrets) > 0 {
		req.Secrets = map[string]api.SecretBinding{}
		for env, b := range in.Secrets {
			if env == "" || b.Secret == "" || len(b.Hosts) == 0 {
				return SandboxOutput{}, inputErrorf("secrets[%q] needs a variable name, a secret and at least one host", env)
			}
			req.Secrets[env] = api.SecretBinding{Secret: b.Secret, Hosts: b.Hosts, Places: b.Places}
		}
	}
	sb, err := t.c.Create(ctx, req)
	if err != nil {
		return SandboxOutput{}, err
	}
	return SandboxOutput{SandboxID: sb.SandboxID, TemplateID: sb.TemplateID, State: "running"}, nil
}

// IDInput names a sandbox.
type IDInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's ID"`
}

// KillOutput is kill_sandbox's answer.
type KillOutput struct {
	Killed bool `json:"killed"`
}

func (t *tools) kill(ctx context.Context, _ *sdk.CallToolRequest, in IDInput) (KillOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return KillOutput{}, err
	}
	if err := t.c.Kill(ctx, in.SandboxID); err != nil {
		return KillOutput{}, err
	}
	return KillOutput{Killed: true}, nil
}

// ListInput filters list_sandboxes.
type ListInput struct {
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"keep the sandboxes with all of these metadata pairs"`
	State    []string          `json:"state,omitempty" jsonschema:"keep the sandboxes in these states (running, paused); empty: all"`
}

// ListOutput is list_sandboxes' answer.
type ListOutput struct {
	Sandboxes []SandboxOutput `json:"sandboxes"`
}

func (t *tools) list(ctx context.Context, _ *sdk.CallToolRequest, in ListInput) (ListOutput, error) {
	for _, s := range in.State {
		if s != "running" && s != "paused" {
			return ListOutput{}, inputErrorf("state %q: want running or paused", s)
		}
	}
	items, err := t.c.List(ctx, client.ListOptions{Metadata: in.Metadata, State: in.State})
	if err != nil {
		return ListOutput{}, err
	}
	out := ListOutput{Sandboxes: []SandboxOutput{}}
	for _, s := range items {
		out.Sandboxes = append(out.Sandboxes, SandboxOutput{SandboxID: s.SandboxID, TemplateID: s.TemplateID, State: s.State,
			StartedAt: s.StartedAt.UTC().Format(time.RFC3339), EndAt: s.EndAt.UTC().Format(time.RFC3339), Metadata: s.Metadata})
	}
	return out, nil
}
