// E2B's `mcp` option on fence, with the unchanged SDK: Sandbox.create({mcp})
// runs fence's mcp-gateway in the sandbox, which starts the configured MCP
// servers and serves their tools on port 50005 (getMcpUrl(), getMcpToken()).
// The test MCP server is written with @modelcontextprotocol/sdk, installed
// from npm in a template build on mcp-gateway.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Sandbox, SandboxError, Template } from 'e2b'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { opts } from '../helpers.mjs'

const api = process.env.E2B_API_URL

// The test server: two tools over stdio.
const serverJS = `
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js'
import { z } from 'zod'
const server = new McpServer({ name: 'fence-test', version: '1.0.0' })
server.registerTool('add', { inputSchema: { a: z.number(), b: z.number() } },
  async ({ a, b }) => ({ content: [{ type: 'text', text: String(a + b) }] }))
server.registerTool('env', { inputSchema: { name: z.string() } },
  async ({ name }) => ({ content: [{ type: 'text', text: String(process.env[name] ?? '') }] }))
await server.connect(new StdioServerTransport())
`

// viaDaemon is a fetch for the MCP client that sends a request for
// getMcpUrl()'s host ({port}-{id}.{domain}) to the daemon with the
// E2b-Sandbox-Id/-Port headers, as a proxy in front of fence would.
function viaDaemon(url, init = {}) {
  const u = new URL(url)
  const label = u.hostname.split('.')[0]
  const dash = label.indexOf('-')
  const headers = new Headers(init.headers)
  headers.set('E2b-Sandbox-Port', label.slice(0, dash))
  headers.set('E2b-Sandbox-Id', label.slice(dash + 1))
  return fetch(new URL(u.pathname + u.search, api), { ...init, headers })
}

async function connect(t, sbx, token) {
  const transport = new StreamableHTTPClientTransport(new URL(sbx.getMcpUrl()), {
    fetch: viaDaemon,
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  })
  const client = new Client({ name: 'fence-e2b-tests', version: '1.0.0' })
  await client.connect(transport)
  t.after(() => client.close().catch(() => {}))
  return client
}

// An MCP server published on npm, for the npm form.
const everythingPkg = '@modelcontextprotocol/server-everything@2026.8.31'
const everything = `npm:${everythingPkg}`

let built
// testTemplate builds, once per run, mcp-gateway plus the test server and
// the MCP SDK from npm.
async function testTemplate(t) {
  if (!built) {
    const dir = mkdtempSync(join(tmpdir(), 'fence-mcpgw-'))
    writeFileSync(join(dir, 'server.mjs'), serverJS)
    const name = `mcpgw-test-${Math.random().toString(36).slice(2, 8)}`
    const tpl = Template({ fileContextPath: dir })
      .fromTemplate('mcp-gateway')
      .runCmd('mkdir -p /opt/testmcp && cd /opt/testmcp && npm init -y >/dev/null && npm install --no-audit --no-fund @modelcontextprotocol/sdk@1.32.2', { user: 'root' })
      .copy('server.mjs', '/opt/testmcp/server.mjs')
      // E2B's way to install servers ahead: `mcp-gateway pull`.
      .addMcpServer(everything)
    built = Template.build(tpl, name, { ...opts }).then(() => name)
  }
  return built
}

test('Sandbox.create({mcp}) serves the servers\' tools at getMcpUrl() to getMcpToken()', async (t) => {
  const template = await testTemplate(t)
  const sbx = await Sandbox.create(template, {
    ...opts,
    timeoutMs: 120_000,
    mcp: { 'github/fence/test': { runCmd: 'node /opt/testmcp/server.mjs', envs: { GREETING: 'hello' } } },
  })
  t.after(() => sbx.kill().catch(() => {}))
  assert.equal(sbx.getMcpUrl(), `https://${sbx.getHost(50005)}/mcp`)
  const token = await sbx.getMcpToken()
  assert.match(token, /^[0-9a-f-]{36}$/)

  const client = await connect(t, sbx, token)
  const { tools } = await client.listTools()
  assert.deepEqual(tools.map((x) => x.name).sort(), ['add', 'env'], 'the servers\' own tool names')
  const sum = await client.callTool({ name: 'add', arguments: { a: 6, b: 36 } })
  assert.deepEqual(sum.content, [{ type: 'text', text: '42' }])
  const env = await client.callTool({ name: 'env', arguments: { name: 'GREETING' } })
  assert.equal(env.content[0].text, 'hello', 'the server got its envs')
  const tok = await client.callTool({ name: 'env', arguments: { name: 'GATEWAY_ACCESS_TOKEN' } })
  assert.equal(tok.content[0].text, '', 'the server never sees the gateway token')

  // A wrong token, and none, are refused before any MCP server.
  for (const auth of ['Bearer wrong', undefined]) {
    const res = await viaDaemon(sbx.getMcpUrl(), {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...(auth ? { Authorization: auth } : {}) },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    })
    assert.equal(res.status, 401, `Authorization ${auth}`)
  }
  await assert.rejects(connect(t, sbx, 'wrong'))

  // After a connect, getMcpToken() reads the token the gateway stored.
  const again = await Sandbox.connect(sbx.sandboxId, opts)
  assert.equal(await again.getMcpToken(), token)
})

test('an npm server installed by Template.addMcpServer starts from the npm form', async (t) => {
  const template = await testTemplate(t)
  const sbx = await Sandbox.create(template, { ...opts, timeoutMs: 120_000, mcp: { everything: { npm: everythingPkg } } })
  t.after(() => sbx.kill().catch(() => {}))
  const client = await connect(t, sbx, await sbx.getMcpToken())
  const { tools } = await client.listTools()
  assert.ok(tools.some((x) => x.name === 'echo'), JSON.stringify(tools.map((x) => x.name)))
  const echo = await client.callTool({ name: 'echo', arguments: { message: 'through the fence' } })
  assert.match(echo.content[0].text, /through the fence/)
})

test('Sandbox.create({mcp}) without a template uses mcp-gateway; a server that cannot start fails the create', async () => {
  const gateways = async () => (await Sandbox.list({ ...opts, query: { state: ['running'] } }).nextItems())
    .filter((s) => s.templateId === 'mcp-gateway').map((s) => s.sandboxId)
  const before = await gateways()
  // The message comes from fence's mcp-gateway, which only the
  // mcp-gateway template has.
  await assert.rejects(
    Sandbox.create({ ...opts, mcp: { broken: { runCmd: 'exit 3' } } }),
    (err) => {
      assert.ok(err instanceof SandboxError, `${err?.name}: ${err?.message}`)
      assert.match(err.message, /Failed to start MCP gateway: .*server "broken"/s)
      return true
    },
  )
  // The SDK killed the sandbox it made.
  assert.deepEqual(await gateways(), before)
})
