// fence's MCP tools through the official MCP TypeScript SDK: `fence mcp`
// over stdio, and the daemon's /mcp over streamable HTTP.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { TEMPLATE } from '../helpers.mjs'

const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY
const fence = fileURLToPath(new URL('../../../bin/fence', import.meta.url))

// session runs create, a command with progress, write/read and kill on
// one connected client.
async function session(t, client) {
  const { tools } = await client.listTools()
  for (const name of ['create_sandbox', 'run_command', 'read_file', 'write_file', 'kill_sandbox']) {
    assert.ok(tools.some((x) => x.name === name), `tools/list lacks ${name}`)
  }
  const created = await client.callTool({ name: 'create_sandbox', arguments: { template: TEMPLATE } })
  assert.equal(created.isError, undefined, JSON.stringify(created.content))
  const id = created.structuredContent.sandbox_id
  t.after(() => client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } }).catch(() => {}))

  // The command waits, after its output, for a file the test writes once
  // the output arrived as progress: the SDK drops a progress notification
  // it reads together with the result.
  const chunks = []
  let streamed
  const arrived = new Promise((resolve) => { streamed = resolve })
  const pending = client.callTool(
    { name: 'run_command', arguments: { sandbox_id: id, command: "python3 -u -c 'print(6*7)'; while [ ! -e /tmp/go ]; do sleep 0.05; done" } },
    undefined,
    { onprogress: (p) => { chunks.push(p.message); streamed() } },
  )
  await arrived
  const go = await client.callTool({ name: 'write_file', arguments: { sandbox_id: id, path: '/tmp/go', content: '' } })
  assert.equal(go.isError, undefined, JSON.stringify(go.content))
  const run = await pending
  assert.equal(run.isError, undefined, JSON.stringify(run.content))
  assert.equal(run.structuredContent.exit_code, 0)
  assert.equal(run.structuredContent.stdout, '42\n')
  assert.equal(chunks.join(''), '42\n')

  const w = await client.callTool({ name: 'write_file', arguments: { sandbox_id: id, path: '/tmp/mcp.txt', content: 'hi\n' } })
  assert.equal(w.isError, undefined, JSON.stringify(w.content))
  const r = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: '/tmp/mcp.txt' } })
  assert.equal(r.structuredContent.content, 'hi\n')

  const bad = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id } })
  assert.equal(bad.isError, true)

  const k = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } })
  assert.equal(k.isError, undefined, JSON.stringify(k.content))
}

test('fence mcp over stdio', async (t) => {
  const transport = new StdioClientTransport({
    command: fence,
    args: ['mcp'],
    env: { FENCE_URL: api, FENCE_API_KEY: key, PATH: process.env.PATH },
    stderr: 'inherit',
  })
  const client = new Client({ name: 'fence-e2b-tests', version: '1.0.0' })
  await client.connect(transport)
  t.after(() => client.close())
  await session(t, client)
})

test('/mcp over streamable HTTP', async (t) => {
  const noKey = new Client({ name: 'fence-e2b-tests', version: '1.0.0' })
  await assert.rejects(noKey.connect(new StreamableHTTPClientTransport(new URL(api + '/mcp'))))

  const transport = new StreamableHTTPClientTransport(new URL(api + '/mcp'), {
    requestInit: { headers: { 'X-API-Key': key } },
  })
  const client = new Client({ name: 'fence-e2b-tests', version: '1.0.0' })
  await client.connect(transport)
  t.after(async () => {
    await transport.terminateSession().catch(() => {})
    await client.close()
  })
  await session(t, client)
})
