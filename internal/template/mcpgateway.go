package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// mcpGatewayLink is where the mcp-gateway template puts the command E2B's
// SDKs run (`mcp-gateway --config JSON`): a link to the in-sandbox binary
// every backend mounts at /.fence/fence, whose mcp-gateway role it plays
// (internal/insandbox/mcpgateway). The gateway is so always the one of the
// fence running the sandbox, never a copy frozen at build time.
const (
	mcpGatewayLink   = "usr/local/bin/mcp-gateway"
	mcpGatewayTarget = "/.fence/fence"
)

// buildMcpGateway copies base's tree (node and npm included, for the MCP
// servers published as npm packages) and adds the gateway's command and
// directories. base must be built first.
func buildMcpGateway(ctx context.Context, s *Store, rootfs string) (string, error) {
	base, err := s.info("base")
	if err != nil {
		return "", fmt.Errorf("mcp-gateway is built from base: %w", err)
	}
	if base.Definition != definition("base") {
		return "", fmt.Errorf("mcp-gateway is built from base, which is out of date: run `fence template build base` first")
	}
	fmt.Fprintf(s.progress, "mcp-gateway: copying base\n")
	out, err := command(ctx, "cp", "-a", "--reflink=auto", base.RootFS+"/.", rootfs).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("copying base: %w: %s", err, out)
	}
	link := filepath.Join(rootfs, mcpGatewayLink)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return "", err
	}
	if err := os.Symlink(mcpGatewayTarget, link); err != nil {
		return "", fmt.Errorf("linking mcp-gateway: %w", err)
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{"etc/mcp-gateway", 0o700}, {"opt/mcp-gateway/npm", 0o755}} {
		p := filepath.Join(rootfs, d.path)
		if err := os.MkdirAll(p, d.mode); err != nil {
			return "", err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return "", err
		}
	}
	return base.Source + "; mcp-gateway at /" + mcpGatewayLink, nil
}
