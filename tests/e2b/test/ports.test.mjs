// Sandbox ports: a server inside the sandbox reached through the daemon,
// routed by the E2b-Sandbox-Id/-Port headers (what E2B_SANDBOX_URL-style
// clients send) and by the {port}-{id}.{domain} Host that getHost() names.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { create, waitFor } from '../helpers.mjs'

const base = new URL(process.env.E2B_API_URL)

// get sends a GET to the daemon with the given headers (Host included,
// which fetch() would not let us set) and returns {status, body}.
function get(path, headers) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, path, headers, method: 'GET' }, (res) => {
      let body = ''
      res.on('data', (d) => (body += d))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('a server in the sandbox is reachable by headers and by getHost()', async (t) => {
  const sbx = await create(t)
  await sbx.files.write('/tmp/www/index.html', 'hello from inside')
  await sbx.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
  const byHeaders = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' }
  const res = await waitFor(async () => {
    const r = await get('/index.html', byHeaders)
    return r.status === 200 ? r : null
  }, 20_000)
  assert.equal(res.body, 'hello from inside')

  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.localhost`)
  const byHost = await get('/index.html', { Host: host })
  assert.equal(byHost.status, 200)
  assert.equal(byHost.body, 'hello from inside')

  // Nothing listens on 8001: the daemon answers 502 in E2B's JSON shape.
  const closed = await get('/', { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8001' })
  assert.equal(closed.status, 502)
  assert.equal(JSON.parse(closed.body).code, 502)

  await sbx.kill()
  const gone = await get('/index.html', byHeaders)
  assert.equal(gone.status, 502)
  assert.deepEqual(JSON.parse(gone.body), { sandboxId: sbx.sandboxId, message: 'The sandbox was not found', code: 502 })
})

test('allowPublicTraffic false requires the traffic access token', async (t) => {
  const sbx = await create(t, { network: { allowPublicTraffic: false } })
  assert.ok(sbx.trafficAccessToken, 'the create response carries trafficAccessToken')
  await sbx.commands.run('mkdir -p /tmp/w && echo ok > /tmp/w/x && cd /tmp/w && python3 -m http.server 8000', { background: true })
  const hdr = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' }
  await waitFor(async () => (await get('/x', { ...hdr, 'E2b-Traffic-Access-Token': sbx.trafficAccessToken })).status === 200, 20_000)
  const without = await get('/x', hdr)
  assert.equal(without.status, 403)
  const wrong = await get('/x', { ...hdr, 'E2b-Traffic-Access-Token': 'nope' })
  assert.equal(wrong.status, 403)
})

test('egress is denied by default', async (t) => {
  const closed = await create(t)
  const r = await closed.commands.run('python3 -c "import socket; socket.create_connection((\'1.1.1.1\', 80), timeout=3)"').catch((e) => e)
  assert.notEqual(r.exitCode, 0, 'a raw connection out is refused by default')
  const dns = await closed.commands.run('getent hosts example.com').catch((e) => e)
  assert.notEqual(dns.exitCode, 0, 'names not allowed do not resolve')
})
