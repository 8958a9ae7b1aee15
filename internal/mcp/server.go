package mcp

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fencesandbox/fence/client"
)

// Name is the server's name in the MCP handshake.
const Name = "fence"

// Bounds of what a tool answers and waits for.
const (
	// OutputCap is how much of each of a command's stdout and stderr
	// run_command returns (the last bytes).
	OutputCap = 64 << 10
	// ReadCap is read_file's default and largest max_bytes.
	ReadCap = 1 << 20
	// DefaultCommandTimeout is run_command's default timeout.
	DefaultCommandTimeout = 60 * time.Second
	// MaxTimeout bounds every timeout a tool takes.
	MaxTimeout = 24 * time.Hour
)

// errInput marks a tool error caused by the tool's arguments.
var errInput = errors.New("invalid argument")

// inputErrorf returns an error about the tool's arguments.
func inputErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInput, fmt.Sprintf(format, args...))
}

// schemas caches the tools' JSON schemas across servers.
var schemas = sdk.NewSchemaCache()

// tools is the state the tools share: the daemon's client.
type tools struct {
	c *client.Client
}

// NewServer returns an MCP server whose tools act on the sandboxes of the
// daemon c talks to.
func NewServer(c *client.Client) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: Name, Title: "fence sandboxes", Version: version()}, &sdk.ServerOptions{
		// The HTTP handler makes a server per request: the tools'
		// schemas are inferred once.
		SchemaCache: schemas,
		Instructions: "Tools to run code in fence sandboxes: disposable Linux machines with default-deny network egress. " +
			"Create a sandbox, run commands and edit files in it, checkpoint it before risky steps and rewind when a step went wrong, kill it when done.",
	})
	t := &tools{c: c}
	addTool(s, "create_sandbox", "Create a sandbox from a template and return its ID. Network egress is denied except to allow_out; secrets are bound by name and only ever reach their hosts.", t.create)
	addTool(s, "run_command", "Run a shell command (sh -c) in a sandbox and return its exit code and the end of its stdout and stderr. With a progress token, output is streamed as progress notifications.", t.run)
	addTool(s, "read_file", "Read a file of a sandbox: text when it is UTF-8, else base64.", t.readFile)
	addTool(s, "write_file", "Write a file in a sandbox (created with its parent directories, or replaced).", t.writeFile)
	addTool(s, "list_files", "List the entries of a directory of a sandbox.", t.listFiles)
	addTool(s, "checkpoint", "Checkpoint a sandbox's filesystem, to diff against or rewind to later.", t.checkpoint)
	addTool(s, "list_checkpoints", "List a sandbox's checkpoints, oldest first.", t.checkpoints)
	addTool(s, "diff", "List the files that differ between two states of a sandbox (checkpoint IDs or names; from empty: as created; to empty: now).", t.diff)
	addTool(s, "rewind", "Reboot a sandbox on one of its checkpoints: its files are the checkpoint's again and its processes start anew.", t.rewind)
	addTool(s, "kill_sandbox", "Kill a sandbox and discard it.", t.kill)
	addTool(s, "list_sandboxes", "List the sandboxes, optionally only those with some metadata or in some states.", t.list)
	return s
}

// addTool registers h as the tool name, turning a panic into a tool error.
func addTool[In, Out any](s *sdk.Server, name, desc string, h func(context.Context, *sdk.CallToolRequest, In) (Out, error)) {
	sdk.AddTool(s, &sdk.Tool{Name: name, Description: desc},
		func(ctx context.Context, req *sdk.CallToolRequest, in In) (res *sdk.CallToolResult, out Out, err error) {
			defer func() {
				if p := recover(); p != nil {
					var zero Out
					res, out, err = nil, zero, fmt.Errorf("%s: internal error: %v", name, p)
				}
			}()
			out, err = h(ctx, req, in)
			return nil, out, err
		})
}

// version is the fence module's version, as the build recorded it.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// envd returns a client of the agent of the sandbox id.
func (t *tools) envd(ctx context.Context, id string) (*client.Envd, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	d, err := t.c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return t.c.Sandbox(id, d.EnvdAccessToken).Envd(), nil
}

func checkID(id string) error {
	if strings.TrimSpace(id) == "" {
		return inputErrorf("sandbox_id is required")
	}
	return nil
}

// seconds converts a timeout in seconds, 0 meaning def.
func seconds(name string, s float64, def time.Duration) (time.Duration, error) {
	if s < 0 || s > MaxTimeout.Seconds() {
		return 0, inputErrorf("%s must be between 0 and %d seconds, got %v", name, int(MaxTimeout.Seconds()), s)
	}
	if s == 0 {
		return def, nil
	}
	return time.Duration(s * float64(time.Second)), nil
}
