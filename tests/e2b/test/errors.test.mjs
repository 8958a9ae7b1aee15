// Errors the SDK must raise from fence's answers, and the features fence
// does not support yet failing cleanly and quickly.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { AuthenticationError, Sandbox, SandboxError, SandboxNotFoundError } from 'e2b'
import { create, opts, within } from './helpers.mjs'

const unknown = 'doesnotexist0000000a'

test('unknown sandbox: SandboxNotFoundError, kill false', async () => {
  assert.equal(await Sandbox.kill(unknown, opts), false)
  await assert.rejects(Sandbox.getInfo(unknown, opts), SandboxNotFoundError)
  await assert.rejects(Sandbox.connect(unknown, opts), SandboxNotFoundError)
  await assert.rejects(Sandbox.setTimeout(unknown, 10_000, opts), SandboxNotFoundError)
  await assert.rejects(Sandbox.getMetrics(unknown, opts), SandboxNotFoundError)
})

test('unknown template is a clear error', async () => {
  await assert.rejects(Sandbox.create('no-such-template', opts), (e) => {
    assert.ok(e instanceof SandboxError, `${e?.name}: ${e?.message}`)
    assert.match(e.message, /no-such-template/)
    return true
  })
})

test('wrong API key: AuthenticationError', async () => {
  const bad = { ...opts, apiKey: 'e2b_' + 'f'.repeat(40) }
  await assert.rejects(Sandbox.create('base', bad), AuthenticationError)
  await assert.rejects(Sandbox.list(bad).nextItems(), AuthenticationError)
  await assert.rejects(Sandbox.getInfo(unknown, bad), AuthenticationError)
  await assert.rejects(Sandbox.kill(unknown, bad), AuthenticationError)
})

test('envd calls need the sandbox\'s own access token', async (t) => {
  const s = await create(t)
  const other = await create(t)
  const call = (token) => fetch(`${process.env.E2B_SANDBOX_URL}/process.Process/List`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'connect-protocol-version': '1',
      'e2b-sandbox-id': s.sandboxId,
      'e2b-sandbox-port': '49983',
      ...(token ? { 'x-access-token': token } : {}),
    },
    body: '{}',
  })
  assert.equal((await call(other.envdAccessToken)).status, 401)
  assert.equal((await call(undefined)).status, 401)
  assert.equal((await call(s.envdAccessToken)).status, 200)
})

test('pause, snapshot and fork fail cleanly and quickly', async (t) => {
  const s = await create(t)
  for (const [what, call] of [
    ['pause', () => s.pause()],
    ['betaPause', () => s.betaPause()],
    ['createSnapshot', () => s.createSnapshot()],
    ['fork', () => s.fork()],
    ['listSnapshots', () => s.listSnapshots().nextItems()],
  ]) {
    await assert.rejects(within(call(), 10_000, what), (e) => {
      assert.ok(e instanceof SandboxError, `${what}: ${e?.name}: ${e?.message}`)
      assert.match(e.message, /not supported/, `${what}: ${e.message}`)
      return true
    })
  }
  // The sandbox is unharmed.
  assert.equal(await s.isRunning(), true)
  assert.equal((await s.commands.run('echo alive')).stdout, 'alive\n')
  // And on an unknown sandbox they say "not found".
  await assert.rejects(Sandbox.pause(unknown, opts), SandboxNotFoundError)
})

test('sandbox ports other than envd (getHost)', { skip: 'needs sandbox networking (issue: network work); only port 49983 is proxied' }, async () => {})

test('a killed sandbox answers envd traffic with the proxy 502', async (t) => {
  const s = await create(t)
  await s.kill()
  assert.equal(await s.isRunning(), false)
  await assert.rejects(s.commands.run('echo hi'), (e) => {
    assert.ok(e instanceof SandboxError, `${e?.name}: ${e?.message}`)
    return true
  })
  await assert.rejects(s.files.read('/etc/hostname'), SandboxError)
})
