package httpapi

import (
	"encoding/json"
	"maps"
	"sort"

	"github.com/fencesandbox/fence/api"
)

// mcpSecrets returns the sandbox's secret bindings joined by those its
// `mcp` option's servers name ({"server": {"secrets": {VAR: binding}}}):
// the server's variable then holds the binding's placeholder, and the
// egress gateway puts the real value only on requests to the binding's
// hosts, as for any binding (netconf validates them all). A variable bound
// twice, or also in envVars, is an error; the rest of the option is the
// mcp-gateway command's to read.
func mcpSecrets(raw json.RawMessage, bindings map[string]api.SecretBinding, envVars map[string]string) (map[string]api.SecretBinding, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return bindings, nil
	}
	var servers map[string]json.RawMessage
	if err := json.Unmarshal(raw, &servers); err != nil {
		return nil, errorf(api.ErrInvalidArgument, "mcp: want an object of servers")
	}
	names := make([]string, 0, len(servers))
	for n := range servers {
		names = append(names, n)
	}
	sort.Strings(names)
	out := maps.Clone(bindings)
	for _, n := range names {
		var cfg struct {
			Secrets map[string]api.SecretBinding `json:"secrets"`
		}
		// A server that is not an object (a catalog entry) names no
		// secrets; mcp-gateway says what it makes of it.
		if json.Unmarshal(servers[n], &cfg) != nil || len(cfg.Secrets) == 0 {
			continue
		}
		if out == nil {
			out = map[string]api.SecretBinding{}
		}
		for v, b := range cfg.Secrets {
			if _, dup := out[v]; dup {
				return nil, errorf(api.ErrInvalidArgument, "mcp server %q: secret variable %s is bound twice", n, v)
			}
			if _, dup := envVars[v]; dup {
				return nil, errorf(api.ErrInvalidArgument, "mcp server %q: secret variable %s is also in envVars", n, v)
			}
			out[v] = b
		}
	}
	return out, nil
}
