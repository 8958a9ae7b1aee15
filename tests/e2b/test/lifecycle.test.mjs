// Sandbox lifecycle through the unmodified SDK: create, connect, getInfo,
// list (metadata filter, pagination), setTimeout, isRunning, kill.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { Sandbox } from 'e2b'
import { TEMPLATE, create, opts, sleep, waitFor } from '../helpers.mjs'

test('Sandbox.create() with no template starts "base"', async (t) => {
  const s = await Sandbox.create({ ...opts })
  t.after(() => s.kill().catch(() => {}))
  assert.match(s.sandboxId, /^[a-z0-9]+$/)
  const info = await s.getInfo()
  assert.equal(info.templateId, 'base')
  assert.equal(await s.isRunning(), true)
})

test('create, getInfo, isRunning, kill', async (t) => {
  const run = randomUUID()
  const s = await create(t, { metadata: { run, purpose: 'life cycle' }, timeoutMs: 60_000 })
  assert.equal(await s.isRunning(), true)

  const info = await s.getInfo()
  assert.equal(info.sandboxId, s.sandboxId)
  assert.equal(info.templateId, TEMPLATE)
  assert.deepEqual(info.metadata, { run, purpose: 'life cycle' })
  assert.equal(info.state, 'running')
  assert.ok(info.startedAt instanceof Date && !Number.isNaN(info.startedAt.getTime()))
  assert.ok(info.endAt instanceof Date && info.endAt > info.startedAt)
  const ttl = info.endAt.getTime() - info.startedAt.getTime()
  assert.ok(ttl > 50_000 && ttl <= 61_000, `endAt - startedAt = ${ttl} ms, want about 60 s`)
  assert.ok(info.cpuCount > 0, `cpuCount = ${info.cpuCount}`)
  assert.ok(info.memoryMB > 0, `memoryMB = ${info.memoryMB}`)
  assert.match(info.envdVersion, /^\d+\.\d+\.\d+$/)

  const same = await Sandbox.getInfo(s.sandboxId, opts)
  assert.equal(same.sandboxId, s.sandboxId)

  assert.equal(await s.kill(), true)
  assert.equal(await s.isRunning(), false)
  assert.equal(await s.kill(), false, 'second kill')
  assert.equal(await Sandbox.kill(s.sandboxId, opts), false, 'static kill of a killed sandbox')
})

test('envVars given at create are visible to every command', async (t) => {
  const s = await create(t, { envs: { FENCE_GLOBAL: 'from create' } })
  const r = await s.commands.run('echo "$FENCE_GLOBAL"')
  assert.equal(r.stdout, 'from create\n')
})

test('connect by ID returns a working handle', async (t) => {
  const s = await create(t)
  await s.files.write('/tmp/marker', 'connected')
  const c = await Sandbox.connect(s.sandboxId, opts)
  assert.equal(c.sandboxId, s.sandboxId)
  assert.equal(await c.files.read('/tmp/marker'), 'connected')
  const r = await c.commands.run('cat /tmp/marker')
  assert.equal(r.stdout, 'connected')
  // The instance method too.
  const again = await s.connect(opts)
  assert.equal(again.sandboxId, s.sandboxId)
  assert.equal(await again.isRunning(), true)
})

test('connect extends but never shortens the timeout', async (t) => {
  const s = await create(t, { timeoutMs: 120_000 })
  const before = (await s.getInfo()).endAt
  await Sandbox.connect(s.sandboxId, { ...opts, timeoutMs: 10_000 })
  const after = (await s.getInfo()).endAt
  assert.ok(after.getTime() >= before.getTime() - 1000, `endAt went from ${before.toISOString()} to ${after.toISOString()}`)
})

test('list filters by metadata and paginates', async (t) => {
  const run = randomUUID()
  const made = []
  for (let i = 0; i < 3; i++) {
    made.push(await create(t, { metadata: { run, idx: String(i), spaced: 'v w&x=y' } }))
  }
  const ids = new Set(made.map((s) => s.sandboxId))

  const all = await Sandbox.list({ ...opts, query: { metadata: { run } } }).nextItems()
  assert.deepEqual(new Set(all.map((s) => s.sandboxId)), ids)
  for (const s of all) {
    assert.equal(s.state, 'running')
    assert.equal(s.templateId, TEMPLATE)
    assert.equal(s.metadata.run, run)
    assert.equal(s.metadata.spaced, 'v w&x=y')
  }
  // Newest first.
  assert.deepEqual(all.map((s) => s.sandboxId), made.map((s) => s.sandboxId).reverse())

  // Two filters ANDed, one with characters that need double encoding.
  const one = await Sandbox.list({ ...opts, query: { metadata: { run, idx: '1', spaced: 'v w&x=y' } } }).nextItems()
  assert.deepEqual(one.map((s) => s.sandboxId), [made[1].sandboxId])
  const none = await Sandbox.list({ ...opts, query: { metadata: { run, idx: '7' } } }).nextItems()
  assert.deepEqual(none, [])

  // Pages of 2: 2, then 1, then no more.
  const pager = Sandbox.list({ ...opts, limit: 2, query: { metadata: { run }, state: ['running'] } })
  assert.equal(pager.hasNext, true)
  const p1 = await pager.nextItems()
  assert.equal(p1.length, 2)
  assert.equal(pager.hasNext, true)
  const p2 = await pager.nextItems()
  assert.equal(p2.length, 1)
  assert.equal(pager.hasNext, false)
  assert.deepEqual(new Set([...p1, ...p2].map((s) => s.sandboxId)), ids)

  // Killed sandboxes leave the list.
  await made[0].kill()
  const left = await Sandbox.list({ ...opts, query: { metadata: { run } } }).nextItems()
  assert.deepEqual(new Set(left.map((s) => s.sandboxId)), new Set([made[1].sandboxId, made[2].sandboxId]))
})

test('setTimeout shortens the life of a sandbox', async (t) => {
  const s = await create(t, { timeoutMs: 120_000 })
  await s.setTimeout(2_000)
  const info = await s.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() < 5_000, `endAt ${info.endAt.toISOString()} is not about 2 s away`)
  assert.equal(await s.isRunning(), true)
  await waitFor(async () => !(await s.isRunning()), 15_000, 250)
  await assert.rejects(s.getInfo(), { name: 'SandboxNotFoundError' })
  assert.equal(await s.kill(), false)
})

test('setTimeout can extend the life of a sandbox', async (t) => {
  const s = await create(t, { timeoutMs: 3_000 })
  await s.setTimeout(60_000)
  await sleep(4_000)
  assert.equal(await s.isRunning(), true)
  const r = await s.commands.run('echo still here')
  assert.equal(r.stdout, 'still here\n')
})

test('getMetrics returns figures', async (t) => {
  const s = await create(t)
  const m = await s.getMetrics()
  assert.ok(Array.isArray(m) && m.length >= 1, `metrics = ${JSON.stringify(m)}`)
  assert.ok(m[0].memTotal > 0, `memTotal = ${m[0].memTotal}`)
  assert.ok(m[0].cpuCount > 0)
})

test('getMetrics over a time range', async (t) => {
  const s = await create(t)
  const before = new Date(Date.now() - 60_000)
  const inRange = await s.getMetrics({ start: before, end: new Date(Date.now() + 60_000) })
  assert.ok(inRange.length >= 1, `metrics in range = ${JSON.stringify(inRange)}`)
  assert.ok(inRange[0].timestamp instanceof Date || typeof inRange[0].timestamp === 'string')
  const long_ago = await s.getMetrics({ start: new Date(1000), end: new Date(2000) })
  assert.deepEqual(long_ago, [], 'no readings before the sandbox existed')
})
