// Pause and resume through the SDK: sandbox.pause() / betaPause(),
// Sandbox.pause(id), sandbox.connect() / Sandbox.connect(id), the lifecycle
// options at create (onTimeout 'pause', autoResume), lists by state, and
// kill of a paused sandbox. fence pauses in place (the sandbox's processes
// are frozen with their memory), so processes and servers continue after
// the resume.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { randomUUID } from 'node:crypto'
import { Sandbox, SandboxError, SandboxNotFoundError } from 'e2b'
import { create, opts, sleep, waitFor, within } from '../helpers.mjs'

const base = new URL(process.env.E2B_API_URL)

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

async function startServer(sbx) {
  await sbx.commands.run('mkdir -p /tmp/www && echo hello > /tmp/www/index.html && cd /tmp/www && python3 -m http.server 8000',
    { background: true })
  await waitFor(async () => (await get('/index.html', { Host: sbx.getHost(8000) })).status === 200, 20_000)
}

test('pause and connect: memory, processes, files, env and servers survive', async (t) => {
  const sbx = await create(t, { envs: { PAUSE_TEST: 'kept' } })
  await sbx.files.write('rel.txt', 'before pause') // relative: the user's home
  const sleeper = await sbx.commands.run('sleep 3600', { background: true })
  await sbx.commands.run('sleep 2 && echo done > /tmp/later', { background: true })
  await startServer(sbx)
  const before = await sbx.getInfo()

  assert.equal(await within(sbx.pause(), 20_000, 'pause'), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await sbx.betaPause(), false, 'a second pause reports false (409)')
  const paused = await sbx.getInfo()
  assert.equal(paused.state, 'paused')
  assert.equal(paused.startedAt.getTime(), before.startedAt.getTime())
  assert.ok(paused.endAt.getTime() <= Date.now(), 'endAt of a paused sandbox is its pause time')
  const served = await get('/index.html', { Host: sbx.getHost(8000) })
  assert.equal(served.status, 502)
  assert.deepEqual(JSON.parse(served.body), { sandboxId: sbx.sandboxId, message: 'The sandbox was not found', code: 502 })

  await sbx.connect(opts)
  assert.equal(await sbx.isRunning(), true)
  const resumed = await sbx.getInfo()
  assert.equal(resumed.state, 'running')
  assert.ok(resumed.startedAt.getTime() > before.startedAt.getTime(), 'a resume starts a new run')
  // The old handle (its token) keeps working.
  assert.equal((await sbx.commands.run('echo $PAUSE_TEST')).stdout, 'kept\n')
  assert.equal(await sbx.files.read('/home/user/rel.txt'), 'before pause')
  const pids = (await sbx.commands.list()).map((p) => p.pid)
  assert.ok(pids.includes(sleeper.pid), `sleep 3600 (pid ${sleeper.pid}) is still listed: ${pids}`)
  const h = await sbx.commands.connect(sleeper.pid)
  await h.kill()
  await waitFor(async () => (await sbx.commands.run('cat /tmp/later || true')).stdout === 'done\n', 20_000)
  assert.equal((await get('/index.html', { Host: sbx.getHost(8000) })).status, 200)
})

// E2B's "completed long running process" case: a command paused right
// after it started counts its sleep through the pause, so a pause longer
// than the sleep ends with its work done (on gVisor the pause lets the
// command's shell start first; see docs/GVISOR.md).
test('a sleep started just before a pause runs on through it', async (t) => {
  const sbx = await create(t)
  await sbx.commands.run('sleep 2 && echo done > /home/user/long_running.txt', { background: true })
  assert.equal(await sbx.files.exists('long_running.txt'), false)
  await sbx.pause()
  await sleep(2500)
  await sbx.connect(opts)
  // Had the sleep begun only at the resume, it would end two seconds on.
  await waitFor(async () => sbx.files.exists('long_running.txt'), 1000)
  assert.equal((await sbx.files.read('long_running.txt')).trim(), 'done')
})

test('Sandbox.pause(id) and Sandbox.connect(id); kill of a paused sandbox', async (t) => {
  const sbx = await create(t)
  assert.equal(await Sandbox.pause(sbx.sandboxId, opts), true)
  assert.equal(await sbx.isRunning(), false)
  const c = await Sandbox.connect(sbx.sandboxId, opts)
  assert.equal(c.sandboxId, sbx.sandboxId)
  assert.equal(c.envdAccessToken, sbx.envdAccessToken, 'the same envd token after a resume')
  assert.equal(await c.isRunning(), true)
  assert.equal((await c.commands.run('echo back')).stdout, 'back\n')

  await c.betaPause()
  assert.equal(await sbx.kill(), true, 'killing a paused sandbox succeeds')
  await assert.rejects(Sandbox.connect(sbx.sandboxId, opts), SandboxNotFoundError)
  await assert.rejects(Sandbox.pause(sbx.sandboxId, opts), SandboxNotFoundError)
})

test('list by state: running and paused', async (t) => {
  const run = randomUUID()
  const a = await create(t, { metadata: { run } })
  const b = await create(t, { metadata: { run } })
  await b.pause()
  const q = (state) => Sandbox.list({ ...opts, query: { metadata: { run }, state } }).nextItems()
  assert.deepEqual((await q(['paused'])).map((s) => s.sandboxId), [b.sandboxId])
  assert.deepEqual((await q(['running'])).map((s) => s.sandboxId), [a.sandboxId])
  const both = await q(['running', 'paused'])
  assert.deepEqual(both.map((s) => [s.sandboxId, s.state]), [[b.sandboxId, 'paused'], [a.sandboxId, 'running']])
  // Resumed, b starts a new run: still the newest.
  await b.connect()
  const after = await q(['running'])
  assert.deepEqual(after.map((s) => s.sandboxId), [b.sandboxId, a.sandboxId])
})

test('onTimeout pause: the sandbox is paused at its deadline, not killed', async (t) => {
  const sbx = await create(t, { timeoutMs: 3_000, lifecycle: { onTimeout: 'pause' } })
  await sbx.files.write('/tmp/f', 'x')
  assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
  await waitFor(async () => (await sbx.getInfo()).state === 'paused', 20_000, 200)
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect({ ...opts, timeoutMs: 60_000 })
  assert.equal((await sbx.getInfo()).state, 'running')
  assert.equal(await sbx.files.read('/tmp/f'), 'x')
})

test('autoResume: traffic to a paused sandbox resumes it', async (t) => {
  const sbx = await create(t, { timeoutMs: 4_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  const created = await sbx.getInfo()
  assert.deepEqual(created.lifecycle, { onTimeout: 'pause', autoResume: true })
  await startServer(sbx)
  await waitFor(async () => (await sbx.getInfo()).state === 'paused', 20_000, 200)
  // Any traffic wakes it, the SDK's own to envd included, so it may be
  // running again already; either way this request is served.
  const r = await get('/index.html', { Host: sbx.getHost(8000) })
  assert.equal(r.status, 200)
  assert.equal(r.body, 'hello\n')
  const info = await sbx.getInfo()
  assert.equal(info.state, 'running')
  assert.ok(info.startedAt.getTime() > created.startedAt.getTime(), 'traffic resumed it (a new run)')
})
