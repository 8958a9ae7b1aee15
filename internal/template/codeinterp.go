package template

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// codeInterpreterFiles are the code-interpreter server and the module it
// loads into every kernel, installed in /opt/fence/code-interpreter.
//
//go:embed codeinterp/server.py codeinterp/fence_kernel.py
var codeInterpreterFiles embed.FS

// codeInterpreterDir is where the server lives inside the template.
const codeInterpreterDir = "/opt/fence/code-interpreter"

// codeInterpreterPackages are base's packages plus Jupyter's Python kernel
// and the usual data libraries, all from Debian.
var codeInterpreterPackages = append(slices.Clone(basePackages),
	"python3-ipykernel", "python3-jupyter-client", "python3-numpy", "python3-pandas", "python3-matplotlib")

// aliases are template names that resolve to another template: the
// code-interpreter SDK's default template name.
var aliases = map[string]string{"code-interpreter-v1": "code-interpreter"}

// readyPorts are the Info.ReadyPorts of the templates that have any.
var readyPorts = map[string][]uint16{"code-interpreter": {codeInterpreterPort}}

// codeInterpreterPort is where the code-interpreter server listens, once
// its default kernel is ready.
const codeInterpreterPort = 49999

// agentServices is /etc/fence/services.json of the code-interpreter
// template: the agent starts the server with the sandbox (see
// agent.ServicesFile; kept in step by hand, the template package does not
// import the agent).
type agentService struct {
	Name string   `json:"name"`
	Argv []string `json:"argv"`
	User string   `json:"user"`
	Dir  string   `json:"dir"`
}

// buildCodeInterpreter builds base's tree plus Jupyter, numpy, pandas and
// matplotlib, and the code-interpreter server, started by the agent.
func buildCodeInterpreter(ctx context.Context, s *Store, rootfs string) (string, error) {
	tmp, err := os.MkdirTemp("", "fence-codeinterp-")
	if err != nil {
		return "", fmt.Errorf("creating staging dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, name := range []string{"server.py", "fence_kernel.py"} {
		b, err := codeInterpreterFiles.ReadFile("codeinterp/" + name)
		if err != nil {
			return "", fmt.Errorf("reading embedded %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(tmp, name), b, 0o644); err != nil {
			return "", fmt.Errorf("staging %s: %w", name, err)
		}
	}
	svcs, err := json.MarshalIndent(map[string][]agentService{"services": {{
		Name: "code-interpreter",
		Argv: []string{"/usr/bin/python3", codeInterpreterDir + "/server.py"},
		User: "user",
		Dir:  "/home/user",
	}}}, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, "services.json"), append(svcs, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("staging services.json: %w", err)
	}
	q := shellQuote(tmp)
	hooks := []string{
		`mkdir -p "$1` + codeInterpreterDir + `" "$1/etc/fence" && cp ` + q + `/server.py ` + q + `/fence_kernel.py "$1` + codeInterpreterDir + `/" && cp ` + q + `/services.json "$1/etc/fence/services.json"`,
		`chroot "$1" python3 -m compileall -q ` + codeInterpreterDir,
		// Matplotlib's font cache, built once here rather than at the
		// first plot of every sandbox.
		`chroot "$1" runuser -u user -- env HOME=/home/user MPLBACKEND=Agg python3 -c "import matplotlib.pyplot"`,
	}
	src, err := debootstrap(ctx, s, rootfs, "code-interpreter", codeInterpreterPackages, "about 3 min", hooks)
	if err != nil {
		return "", err
	}
	return src + "; the code-interpreter server in " + codeInterpreterDir, nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
