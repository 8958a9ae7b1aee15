// Errors the SDK must raise from fence's answers, and the features fence
// does not support failing cleanly and quickly.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  AuthenticationError, CommandExitError, InvalidArgumentError, Sandbox, SandboxError, SandboxNotFoundError,
} from 'e2b'
import { create, opts, within } from '../helpers.mjs'

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

test('pause of an unknown sandbox says not found', async () => {
  await assert.rejects(Sandbox.pause(unknown, opts), SandboxNotFoundError)
})

test('envd errors map to the SDK\'s error classes', async (t) => {
  const s = await create(t)
  await assert.rejects(s.commands.run('id', { user: 'nosuchuser' }), AuthenticationError)
  await assert.rejects(s.files.read('/etc/hostname', { user: 'nosuchuser' }), AuthenticationError)
  await assert.rejects(s.files.read('/tmp'), InvalidArgumentError)
  await assert.rejects(s.files.write('/tmp', 'x'), InvalidArgumentError)
  await assert.rejects(s.files.list('/etc/hostname'), InvalidArgumentError)
  await assert.rejects(s.files.makeDir('/etc/hostname'), InvalidArgumentError)
  await assert.rejects(s.files.watchDir('/etc/hostname', () => {}), InvalidArgumentError)
  await assert.rejects(s.commands.run('pwd', { cwd: '/nope' }), InvalidArgumentError)
  await assert.rejects(s.commands.run('nosuchcommand'), (e) => e instanceof CommandExitError && e.exitCode === 127)
  const h = await s.commands.run('sleep 5', { background: true })
  await assert.rejects(s.commands.sendStdin(h.pid, 'x'), /stdin is not open/)
})

test('a killed sandbox: the SDK reports it gone', async (t) => {
  const s = await create(t)
  await s.kill()
  assert.equal(await s.isRunning(), false)
  await assert.rejects(s.commands.run('echo hi'), SandboxNotFoundError)
  await assert.rejects(s.files.read('/etc/hostname'), { name: 'TimeoutError', message: /The sandbox was not found/ })
  await assert.rejects(s.files.exists('/etc/hostname'), { name: 'TimeoutError' })
  await assert.rejects(s.commands.list(), { name: 'TimeoutError' })
  const r = await fetch(`${process.env.E2B_SANDBOX_URL}/health`, {
    headers: { 'e2b-sandbox-id': s.sandboxId, 'e2b-sandbox-port': '49983' },
  })
  assert.equal(r.status, 502)
  assert.deepEqual(await r.json(), { sandboxId: s.sandboxId, message: 'The sandbox was not found', code: 502 })
})
