// fence's idle pause through the official SDK: a sandbox created with
// lifecycle.idleTimeout (a fence extension the SDK does not send, so the
// create is a plain POST and the handle the SDK's Sandbox.connect) is
// paused once idle, and the SDK's own calls resume it: commands.run (envd
// traffic) and Sandbox.connect, with its files and processes.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'
import { TEMPLATE, opts, waitFor } from '../helpers.mjs'

async function createIdle(t, seconds) {
  const res = await fetch(new URL('/sandboxes', process.env.E2B_API_URL), {
    method: 'POST',
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ templateID: TEMPLATE, timeout: 300, lifecycle: { idleTimeout: seconds } }),
  })
  assert.equal(res.status, 201, await res.clone().text())
  const { sandboxID } = await res.json()
  const sbx = await Sandbox.connect(sandboxID, opts)
  t.after(async () => {
    await sbx.kill().catch(() => {})
  })
  return sbx
}

const paused = (sbx) => waitFor(async () => (await sbx.getInfo()).state === 'paused', 120_000, 200)

test('an idle sandbox is paused; commands.run and connect resume it with its files and processes', async (t) => {
  const sbx = await createIdle(t, 2)
  await sbx.files.write('/tmp/f', 'kept')
  const pid = (await sbx.commands.run('sleep 3600 >/dev/null 2>&1 </dev/null & echo $!')).stdout.trim()
  // getInfo is no use of the sandbox (isRunning would be: it asks envd).
  await paused(sbx)

  const r = await sbx.commands.run(`cat /tmp/f && kill -0 ${pid} && echo alive`)
  assert.equal(r.stdout, 'keptalive\n')
  assert.equal((await sbx.getInfo()).state, 'running')

  await paused(sbx)
  const again = await Sandbox.connect(sbx.sandboxId, opts)
  assert.equal((await again.getInfo()).state, 'running')
  assert.equal(await again.files.read('/tmp/f'), 'kept')
})

test('lifecycle.idleTimeout out of range is 400 and creates nothing', async () => {
  // Other test files run beside this one and create sandboxes of their
  // own: what this test's refused creates must not leave is a sandbox
  // carrying their mark.
  const mark = `refused-${process.pid}-${Date.now()}`
  for (const idleTimeout of [-1, 2_592_001, 'soon']) {
    const res = await fetch(new URL('/sandboxes', process.env.E2B_API_URL), {
      method: 'POST',
      headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
      body: JSON.stringify({ templateID: TEMPLATE, metadata: { mark }, lifecycle: { idleTimeout } }),
    })
    assert.equal(res.status, 400, `idleTimeout ${idleTimeout}`)
  }
  const left = await Sandbox.list({ ...opts, query: { metadata: { mark } } }).nextItems()
  assert.deepEqual(left.map((s) => s.sandboxId), [])
})
