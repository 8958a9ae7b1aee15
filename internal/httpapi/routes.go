package httpapi

import "net/http"

const routeHealth = "GET /health"

// routes is THE control-plane route table.
func (h *handler) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc(routeHealth, h.health)

	mux.HandleFunc("POST /sandboxes", h.create)
	mux.HandleFunc("POST /v2/sandboxes", h.create)
	mux.HandleFunc("GET /sandboxes", h.listV1)
	mux.HandleFunc("GET /v2/sandboxes", h.listV2)
	mux.HandleFunc("GET /sandboxes/{id}", h.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", h.kill)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", h.setTimeout)
	mux.HandleFunc("POST /sandboxes/{id}/pause", h.pause)
	mux.HandleFunc("POST /sandboxes/{id}/resume", h.resume)
	mux.HandleFunc("POST /sandboxes/{id}/connect", h.connect)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", h.connect)
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", h.refresh)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", h.metrics)
	mux.HandleFunc("GET /sandboxes/metrics", h.metricsOfSandboxes)
	mux.HandleFunc("GET /sandboxes/{id}/downloads", h.sandboxDownloads)
	mux.HandleFunc("GET /sandboxes/{id}/logs", h.sandboxLogsV1)
	mux.HandleFunc("GET /v2/sandboxes/{id}/logs", h.sandboxLogsV2)
	mux.HandleFunc("GET /sandboxes/{id}/export", h.export)
	mux.HandleFunc("GET /usage", h.usage)
	mux.HandleFunc("GET /audit", h.auditQuery)
	mux.HandleFunc("GET /audit/stream", h.auditStream)
	h.registerAuditVerify(mux)
	mux.HandleFunc("POST /secrets", h.createSecret)
	mux.HandleFunc("GET /secrets", h.listSecrets)
	mux.HandleFunc("GET /secrets/{secretID}", h.getSecret)
	mux.HandleFunc("POST /secrets/{secretID}", h.updateSecret)
	mux.HandleFunc("DELETE /secrets/{secretID}", h.deleteSecret)
	// Template builds (internal/tbuild).
	mux.HandleFunc("POST /v3/templates", h.registerTemplate)
	mux.HandleFunc("GET /templates/{id}/files/{hash}", h.templateFiles)
	mux.HandleFunc("POST /v2/templates/{id}/builds/{buildID}", h.triggerBuild)
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}/status", h.buildStatus)
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}/logs", h.buildLogs)
	mux.HandleFunc("POST /templates/tags", h.assignTags)
	mux.HandleFunc("DELETE /templates/tags", h.removeTags)
	mux.HandleFunc("GET /templates/{a}/{b}", h.templateSub) // aliases/{alias}, {id}/tags
	mux.HandleFunc("DELETE /templates/{id}", h.deleteTemplate)
	mux.HandleFunc("GET /templates", h.listTemplates)
	mux.HandleFunc("GET /v2/templates", h.listTemplates)
	mux.HandleFunc("GET /templates/{id}", h.getTemplate)
	mux.HandleFunc("PATCH /templates/{id}", h.patchTemplate)
	mux.HandleFunc("PATCH /v2/templates/{id}", h.patchTemplate)
	if h.promMetrics != nil {
		mux.Handle("GET /metrics", h.adminOnly(h.promMetrics))
	}

	mux.HandleFunc("POST /sandboxes/{id}/fork", h.fork)
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", h.createSnapshot)
	mux.HandleFunc("POST /sandboxes/{id}/checkpoints", h.createCheckpoint)
	mux.HandleFunc("GET /sandboxes/{id}/checkpoints", h.listCheckpoints)
	mux.HandleFunc("POST /sandboxes/{id}/rewind", h.rewind)
	mux.HandleFunc("GET /sandboxes/{id}/diff", h.diff)
	mux.HandleFunc("PUT /sandboxes/{id}/network", h.updateNetwork)
	mux.HandleFunc("GET /snapshots", h.listSnapshots)

	// Teams, API keys and access tokens (identity.go).
	mux.HandleFunc("GET /teams", h.listTeams)
	mux.HandleFunc("GET /api-keys", h.listAPIKeys)
	mux.HandleFunc("POST /api-keys", h.createAPIKey)
	mux.HandleFunc("PATCH /api-keys/{apiKeyID}", h.renameAPIKey)
	mux.HandleFunc("DELETE /api-keys/{apiKeyID}", h.deleteAPIKey)
	mux.HandleFunc("GET /access-tokens", h.listAccessTokens)
	mux.HandleFunc("POST /access-tokens", h.createAccessToken)
	mux.HandleFunc("DELETE /access-tokens/{accessTokenID}", h.deleteAccessToken)
	mux.HandleFunc("GET /admin/teams", h.adminListTeams)
	mux.HandleFunc("POST /admin/teams", h.adminCreateTeam)
	mux.HandleFunc("GET /admin/teams/{teamID}/api-keys", h.adminListAPIKeys)
	mux.HandleFunc("POST /admin/teams/{teamID}/api-keys", h.adminCreateAPIKey)
	mux.HandleFunc("DELETE /admin/teams/{teamID}/api-keys/{apiKeyID}", h.adminDeleteAPIKey)
	mux.HandleFunc("POST /admin/teams/{teamID}/sandboxes/kill", h.adminKillTeam)
	mux.HandleFunc("GET /admin/sandboxes/running-counts", h.adminRunningCounts)
	mux.HandleFunc("GET /teams/{teamID}/limits", h.getTeamLimits)
	mux.HandleFunc("PUT /teams/{teamID}/limits", h.putTeamLimits)
	mux.HandleFunc("GET /teams/{teamID}/limits/usage", h.getTeamUsage)
	h.registerTeamMetrics(mux)
	mux.HandleFunc("POST /ssh-keys", h.createSSHKey)
	mux.HandleFunc("GET /ssh-keys", h.listSSHKeys)
	mux.HandleFunc("DELETE /ssh-keys/{id}", h.deleteSSHKey)
	mux.HandleFunc("GET /approvals", h.listApprovals)
	mux.HandleFunc("GET /approvals/stream", h.approvalStream)
	mux.HandleFunc("POST /approvals/{id}", h.decideApproval)
	h.registerVolumes(mux)
	h.registerPrincipal(mux)
	h.registerBuildLogStream(mux)
	h.registerMoves(mux)
	if h.mcp != nil {
		mux.Handle("/mcp", h.mcp) // GET, POST and DELETE: MCP's streamable HTTP
	}
	return mux
}
