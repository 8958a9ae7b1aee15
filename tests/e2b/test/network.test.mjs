// E2B's network forms through the SDK: what create and updateNetwork
// accept, what getInfo shows, and the 400s for invalid forms. The SDK tests
// have no internet, so whether traffic is allowed is checked by the
// integration tests (TestNetworkForms) instead.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { create, opts } from '../helpers.mjs'

// A public address (TEST-NET-2): valid as a proxy address, never dialed
// here.
const proxyAddress = '198.51.100.5:1080'
const proxyPassword = 'sdk-proxy-password-never-returned'

test('allowlist: denyOut ALL_TRAFFIC with allowOut, shown by getInfo, cleared by updateNetwork({})', async (t) => {
  const s = await create(t, {
    network: {
      denyOut: ({ allTraffic }) => [allTraffic],
      allowOut: ['1.1.1.1', 'api.example.com', '*.example.org'],
      rules: { 'API.example.com': [{ transform: { headers: { 'X-Team': 'fence' } } }] },
    },
  })
  let info = await s.getInfo()
  assert.deepEqual(info.network.denyOut, ['0.0.0.0/0'])
  assert.deepEqual(info.network.allowOut, ['1.1.1.1', 'api.example.com', '*.example.org'])
  assert.deepEqual(info.network.rules, { 'api.example.com': [{ transform: { headers: { 'X-Team': 'fence' } } }] })
  assert.equal(info.network.egressProxy, undefined)

  await s.updateNetwork({})
  info = await s.getInfo()
  assert.equal(info.network, undefined, `network after updateNetwork({}): ${JSON.stringify(info.network)}`)

  await s.updateNetwork({ denyOut: ['8.8.8.8'], allowInternetAccess: false })
  info = await s.getInfo()
  assert.deepEqual(info.network.denyOut, ['8.8.8.8'])
  assert.equal(info.allowInternetAccess, false)
})

test('egressProxy: shown without its password, replaced and removed by updateNetwork', async (t) => {
  const s = await create(t, {
    network: {
      egressProxy: { address: proxyAddress, username: 'alice', password: proxyPassword },
      allowPublicTraffic: true,
    },
  })
  let info = await s.getInfo()
  assert.deepEqual(info.network.egressProxy, { address: proxyAddress, username: 'alice' })
  assert.equal(info.network.allowPublicTraffic, true)
  // No route returns the password.
  const raw = await fetch(`${process.env.E2B_API_URL}/sandboxes/${s.sandboxId}`, {
    headers: { 'X-API-Key': process.env.E2B_API_KEY },
  }).then((r) => r.text())
  assert.ok(!raw.includes(proxyPassword), `getInfo body shows the password: ${raw}`)
  const listed = await Sandbox.list(opts).nextItems()
  assert.ok(!JSON.stringify(listed).includes(proxyPassword))

  // An update without egressProxy stops tunnelling; ingress fields stay.
  await s.updateNetwork({ denyOut: ['8.8.8.8'] })
  info = await s.getInfo()
  assert.equal(info.network.egressProxy, undefined)
  assert.equal(info.network.allowPublicTraffic, true)
  await s.updateNetwork({ egressProxy: { address: '198.51.100.6:1080' } })
  info = await s.getInfo()
  assert.deepEqual(info.network.egressProxy, { address: '198.51.100.6:1080' })
})

test('invalid network forms are 400s from create and updateNetwork', async (t) => {
  const bad = [
    [{ denyOut: ['example.com'] }, /invalid denied CIDR example\.com/],
    [{ allowOut: ['example.com'] }, /you must include 'ALL_TRAFFIC' in deny out/],
    [{ denyOut: ['0.0.0.0'] }, /invalid denied CIDR 0\.0\.0\.0/],
    [{ rules: { 'a.example': [{ transform: { headers: { X: 'Bearer ${e2b.secrets.key' } } }] } },
      /malformed E2B placeholder/],
    [{ rules: { '*': [{ transform: { headers: { X: '1' } } }] } }, /not a DNS name/],
    [{ egressProxy: { address: '127.0.0.1:1080' } }, /Invalid egress proxy config/],
    [{ egressProxy: { address: proxyAddress, password: 'p' } }, /Invalid egress proxy config/],
  ]
  for (const [network, msg] of bad) {
    await assert.rejects(Sandbox.create('base', { ...opts, network }), (e) => {
      assert.match(e.message, /400/, `${JSON.stringify(network)}: ${e.message}`)
      assert.match(e.message, msg)
      return true
    })
  }
  const s = await create(t, { network: { denyOut: ['0.0.0.0/0'] } })
  for (const [network, msg] of bad) {
    await assert.rejects(s.updateNetwork(network), (e) => {
      assert.match(e.message, msg, `${JSON.stringify(network)}: ${e.message}`)
      return true
    })
  }
  // Nothing changed.
  assert.deepEqual((await s.getInfo()).network.denyOut, ['0.0.0.0/0'])
})
