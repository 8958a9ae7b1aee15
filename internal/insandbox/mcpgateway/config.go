package mcpgateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
)

// Server is one MCP server of the gateway's configuration: a command
// speaking MCP over stdio, installed first by InstallCmd when it has one.
type Server struct {
	// Name is the configuration's key for the server.
	Name string
	// RunCmd starts the server (`sh -c`); it speaks MCP on its stdin and
	// stdout.
	RunCmd string
	// InstallCmd, if not empty, runs (`sh -c`) before the server starts;
	// a failure fails the gateway's start.
	InstallCmd string
	// Envs are added to the server's environment.
	Envs map[string]string
	// Secrets names the sandbox's secret bindings the server gets: each
	// variable holds the binding's placeholder, which the egress gateway
	// swaps for the real value only on requests to the binding's hosts.
	Secrets []string
	// NPM, for a server given as an npm package, is its spec
	// ("name" or "name@version"); Args are its command-line arguments.
	NPM  string
	Args []string
}

// serverJSON is a server's configuration on the wire: E2B's custom form
// {runCmd, installCmd, envs}, fence's npm form {npm, args, envs}, and the
// secret bindings either may name (a fence extension the daemon reads at
// create; see docs/MCP.md).
type serverJSON struct {
	RunCmd     string                     `json:"runCmd"`
	InstallCmd string                     `json:"installCmd"`
	Envs       map[string]string          `json:"envs"`
	NPM        string                     `json:"npm"`
	Args       []string                   `json:"args"`
	Secrets    map[string]json.RawMessage `json:"secrets"`
}

// envNameRE is a variable name a server's environment may take.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// npmSpecRE is an npm package spec: an optionally scoped name and an
// optional version or tag.
var npmSpecRE = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*(@[A-Za-z0-9._^~<>=| -]+)?$`)

// reservedEnv are variables a server's configuration may not set.
var reservedEnv = map[string]bool{tokenEnv: true}

// ParseConfig reads the gateway's configuration: a JSON object from server
// names to server configurations. Servers come back sorted by name. Any
// server it cannot run is an error naming it; E2B's catalog names (a
// server configured by its catalog entry alone) are not supported.
func ParseConfig(b []byte) ([]Server, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("config: want a JSON object of servers: %w", err)
	}
	if len(raw) == 0 {
		return nil, errors.New("config: no servers")
	}
	names := make([]string, 0, len(raw))
	for n := range raw {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]Server, 0, len(names))
	for _, name := range names {
		s, err := parseServer(name, raw[name])
		if err != nil {
			return nil, fmt.Errorf("config: server %q: %w", name, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func parseServer(name string, b json.RawMessage) (Server, error) {
	if name == "" || len(name) > 128 || strings.ContainsAny(name, "\x00\n") {
		return Server{}, errors.New("want a name of 1 to 128 characters on one line")
	}
	var j serverJSON
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Server{}, fmt.Errorf("want {runCmd, installCmd?, envs?, secrets?} or {npm, args?, envs?, secrets?} (catalog servers are not supported): %w", err)
	}
	s := Server{Name: name, RunCmd: j.RunCmd, InstallCmd: j.InstallCmd, Envs: j.Envs, NPM: j.NPM, Args: j.Args}
	switch {
	case j.NPM != "" && (j.RunCmd != "" || j.InstallCmd != ""):
		return Server{}, errors.New("npm and runCmd/installCmd exclude each other")
	case j.NPM != "":
		if !npmSpecRE.MatchString(j.NPM) {
			return Server{}, fmt.Errorf("npm %q is not a package spec (name or name@version)", j.NPM)
		}
	case j.RunCmd == "":
		return Server{}, errors.New("want runCmd (or npm)")
	case len(j.Args) > 0:
		return Server{}, errors.New("args go with npm only (put them in runCmd)")
	}
	for k := range j.Envs {
		if !envNameRE.MatchString(k) || reservedEnv[k] {
			return Server{}, fmt.Errorf("env %q: not a variable name a server may set", k)
		}
	}
	for k := range j.Secrets {
		if !envNameRE.MatchString(k) || reservedEnv[k] {
			return Server{}, fmt.Errorf("secret variable %q: not a variable name a server may set", k)
		}
		if _, dup := j.Envs[k]; dup {
			return Server{}, fmt.Errorf("variable %q is both in envs and in secrets", k)
		}
		s.Secrets = append(s.Secrets, k)
	}
	sort.Strings(s.Secrets)
	return s, nil
}

// npmName is the package name of an npm spec, without its version.
func npmName(spec string) string {
	at := strings.LastIndex(spec, "@")
	if at > 0 {
		return spec[:at]
	}
	return spec
}

// npmDir is where the npm form installs a package (see Pull).
func npmDir(spec string) string {
	return path.Join(npmRoot, strings.ReplaceAll(npmName(spec), "/", "__"))
}
