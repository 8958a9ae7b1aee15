package isolation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// agentConfigureWait bounds ConfigureAgent: the agent is untrusted, and a
// sandbox that does not answer in time fails its create.
const agentConfigureWait = 10 * time.Second

// ConfigureAgent hands cfg to sb's running agent (its POST /init), which
// replaces the agent's environment, default user and working directory
// for the processes it starts from then on. It is how a sandbox whose
// agent did not boot with cfg (one started ahead of its request, or
// restored from a checkpoint with another sandbox's memory) gets its own.
func ConfigureAgent(ctx context.Context, sb Sandbox, cfg AgentConfig) error {
	body, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, agentConfigureWait)
	defer cancel()
	if err := AgentRequest(ctx, sb, http.MethodPost, "/init", body); err != nil {
		return fmt.Errorf("configuring agent: %w", err)
	}
	return nil
}

// AgentRequest sends one request to sb's agent on a connection of its own
// (a JSON body when body is not nil) and wants a 2xx answer; the answer's
// body is not read.
func AgentRequest(ctx context.Context, sb Sandbox, method, path string, body []byte) error {
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return sb.DialAgent(ctx) },
		DisableKeepAlives: true,
	}}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
