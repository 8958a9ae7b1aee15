// The lifecycle SDK calls on gvisor sandboxes (metadata fence.backend:
// gvisor): there a pause, a snapshot, a fork and a checkpoint keep memory
// and running processes (gVisor checkpoint images), where native keeps
// the files alone. A handful of tests, to keep the run short. They need
// runsc (scripts/build-runsc.sh); without it they are skipped, but not
// under CI=true.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { randomBytes } from 'node:crypto'
import { Sandbox, Template, waitForFile } from 'e2b'
import { create, opts, waitFor } from '../helpers.mjs'

const gvisor = { metadata: { 'fence.backend': 'gvisor' } }
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

// createGvisor creates a gvisor sandbox, or skips the test when the daemon
// has no gvisor backend (never under CI).
async function createGvisor(t, extra = {}) {
  try {
    return await create(t, { ...gvisor, ...extra })
  } catch (e) {
    if (!process.env.CI && /not available/.test(String(e))) {
      t.skip('no gvisor backend on this daemon (runsc missing)')
      return null
    }
    throw e
  }
}

async function track(t, sbx) {
  t.after(async () => {
    await sbx.kill().catch(() => {})
  })
  return sbx
}

// startWork starts an http server whose page is in memory only once
// served (python keeps the directory listing out of it: a file), and a
// counter loop whose count lives in the shell's memory.
async function startWork(sbx) {
  await sbx.commands.run('mkdir -p /tmp/www && echo hello-gvisor > /tmp/www/index.html && cd /tmp/www && python3 -m http.server 8000',
    { background: true })
  await sbx.commands.run('i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done', { background: true })
  await waitFor(async () => (await get('/index.html', { Host: sbx.getHost(8000) })).status === 200, 20_000)
}

async function count(sbx) {
  const r = await sbx.commands.run('for i in 1 2 3 4 5; do c=$(cat /tmp/c 2>/dev/null); [ -n "$c" ] && break; sleep 0.05; done; echo ${c:-0}')
  return Number(r.stdout.trim())
}

// goesOn checks that sbx runs what its source ran: the server serves and
// the loop counts on from at least from.
async function goesOn(sbx, from) {
  const c = await count(sbx)
  assert.ok(c >= from, `counter ${c} below ${from}: the loop did not go on`)
  await waitFor(async () => (await count(sbx)) > c, 20_000)
  const r = await get('/index.html', { Host: sbx.getHost(8000) })
  assert.equal(r.status, 200)
  assert.equal(r.body, 'hello-gvisor\n')
}

test('gvisor: pause and connect keep memory and processes', async (t) => {
  const sbx = await createGvisor(t)
  if (!sbx) return
  await startWork(sbx)
  const c = await count(sbx)
  assert.equal(await sbx.pause(opts), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  await sbx.connect(opts)
  await goesOn(sbx, c)
})

test('gvisor: createSnapshot keeps running processes; forks are independent', async (t) => {
  const sbx = await createGvisor(t, { envs: { GV: 'env' } })
  if (!sbx) return
  await startWork(sbx)
  const c = await count(sbx)
  const snap = await sbx.createSnapshot(opts)
  t.after(async () => {
    await Sandbox.deleteSnapshot(snap.snapshotId, opts).catch(() => {})
  })
  // The create's envs and metadata are the new sandbox's, on top of the
  // snapshot's envs, although its agent is the snapshot's, restored.
  const a = await track(t, await Sandbox.create(snap.snapshotId,
    { ...opts, timeoutMs: 120_000, envs: { NEW: 'new' }, metadata: { from: 'snap' } }))
  await goesOn(a, c)
  assert.equal((await a.commands.run('echo $GV $NEW')).stdout, 'env new\n')
  const ai = await a.getInfo()
  assert.equal(ai.metadata.from, 'snap')
  assert.equal(ai.metadata['fence.backend'], 'gvisor')
  assert.equal(ai.templateId, snap.snapshotId.split(':')[0], 'templateId is the snapshot template\'s')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, opts), true)
  await goesOn(a, c) // runs on after its snapshot's delete

  const forks = await Sandbox.fork(sbx.sandboxId, { ...opts, count: 2, timeoutMs: 60_000 })
  for (const f of forks) await track(t, f)
  assert.equal(forks.length, 2)
  for (const f of forks) {
    await goesOn(f, c)
    assert.equal((await f.commands.run('echo $GV')).stdout, 'env\n')
    assert.equal((await f.getInfo()).metadata['fence.backend'], 'gvisor')
  }
  await forks[0].files.write('/tmp/www/index.html', 'fork zero\n')
  await forks[0].commands.run('sleep 1234', { background: true })
  for (const s of [sbx, forks[1]]) {
    assert.equal((await get('/index.html', { Host: s.getHost(8000) })).body, 'hello-gvisor\n')
    assert.equal((await s.commands.run('ps -eo args | grep -c "^sleep 1234" || true')).stdout, '0\n')
  }
  assert.equal((await get('/index.html', { Host: forks[0].getHost(8000) })).body, 'fork zero\n')
})

test('gvisor: pause without memory keeps the files and drops the processes', async (t) => {
  const sbx = await createGvisor(t)
  if (!sbx) return
  await sbx.files.write('/home/user/kept.txt', 'kept')
  await sbx.commands.run('sleep 3600', { background: true })
  assert.equal(await sbx.pause({ ...opts, keepMemory: false }), true)
  await sbx.connect(opts)
  assert.equal(await sbx.files.read('/home/user/kept.txt'), 'kept')
  assert.equal((await sbx.commands.run('ps -eo args | grep -c "^sleep 3600" || true')).stdout, '0\n')
})

test('gvisor: a template\'s start command runs once; later sandboxes restore its running state', async (t) => {
  const probe = await createGvisor(t)
  if (!probe) return
  await probe.kill()
  const name = `tpl-gv-${randomBytes(4).toString('hex')}`
  // The start command stamps the moment it ran and keeps a counter in memory.
  // The stamp appears whole (written aside, then renamed): the ready check
  // sees the file only once it holds the time, so the run image cannot be
  // taken between the shell's open and date's write, when every restore
  // would write a stamp of its own.
  const tpl = Template().fromTemplate('base').setStartCmd(
    'date +%s%N > /tmp/started.new && mv /tmp/started.new /tmp/started; i=0; while :; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done',
    waitForFile('/tmp/started'))
  const info = await Template.build(tpl, name, opts)
  t.after(async () => {
    await fetch(`${process.env.E2B_API_URL}/templates/${info.templateId}`, {
      method: 'DELETE', headers: { 'X-API-Key': process.env.E2B_API_KEY },
    }).catch(() => {})
  })
  const first = await create(t, { template: name, ...gvisor })
  const stamp = (await first.commands.run('cat /tmp/started')).stdout
  const t0 = Date.now()
  const second = await create(t, { template: name, ...gvisor })
  const third = await create(t, { template: name, ...gvisor })
  console.log(`two creates from the run image: ${Date.now() - t0} ms`)
  for (const s of [second, third]) {
    // The same start: it was not run again, its state was restored.
    assert.equal((await s.commands.run('cat /tmp/started')).stdout, stamp)
    const c = await count(s)
    await waitFor(async () => (await count(s)) > c, 20_000)
  }
  // Independent of each other.
  await second.commands.run('echo mine > /tmp/started')
  assert.equal((await third.commands.run('cat /tmp/started')).stdout, stamp)
  // Another environment is another image: the start command runs anew.
  const other = await create(t, { template: name, ...gvisor, envs: { OTHER: '1' } })
  assert.notEqual((await other.commands.run('cat /tmp/started')).stdout, stamp)
})
