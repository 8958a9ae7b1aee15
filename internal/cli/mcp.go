package cli

import (
	"io"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/internal/mcp"
)

func mcpCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve a daemon's sandboxes as MCP tools over stdio, for AI agents",
		Long: `Serve the Model Context Protocol on standard input and output: an agent
(Claude Code, Cursor, any MCP client) that starts this command gets tools to
create sandboxes, run commands, read, write and list files, checkpoint, diff
and rewind, and kill sandboxes, all on the daemon at --url (FENCE_URL) with
--api-key (FENCE_API_KEY). Nothing but MCP messages is written to stdout.
See docs/MCP.md.`,
		Example: `  claude mcp add --transport stdio --env FENCE_URL=http://127.0.0.1:3000 --env FENCE_API_KEY=$key fence -- fence mcp`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			t := &sdk.IOTransport{Reader: io.NopCloser(cmd.InOrStdin()), Writer: nopWriteCloser{cmd.OutOrStdout()}}
			return mcp.NewServer(c).Run(cmd.Context(), t)
		},
	}
	cf.add(cmd.Flags())
	return cmd
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
