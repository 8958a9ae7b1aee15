// Run by integration/scaleout_test.go against a fence router in front of
// several nodes (not by run.sh): sandboxes made through the SDK land on
// several nodes, and each works through the one URL. The IDs are written to
// $FENCE_SPREAD_OUT for the Go test to check their nodes.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { writeFileSync } from 'node:fs'
import { Sandbox } from 'e2b'
import { opts } from '../helpers.mjs'

test('sandboxes made through the router spread and work', async () => {
  const boxes = await Promise.all(Array.from({ length: 6 }, () =>
    Sandbox.create('base', { ...opts, timeoutMs: 120_000 })))
  try {
    for (const [i, s] of boxes.entries()) {
      const r = await s.commands.run(`echo box-${i}`)
      assert.equal(r.stdout, `box-${i}\n`)
      await s.files.write('/tmp/a.txt', `content ${i}`)
      await s.files.rename('/tmp/a.txt', '/tmp/b.txt')
      assert.equal(await s.files.read('/tmp/b.txt'), `content ${i}`)
    }
    const listed = []
    const pager = Sandbox.list({ ...opts, limit: 2 })
    while (pager.hasNext) listed.push(...(await pager.nextItems()))
    const ids = new Set(listed.map((x) => x.sandboxId))
    for (const s of boxes) assert.ok(ids.has(s.sandboxId), `list through the router lacks ${s.sandboxId}`)
    writeFileSync(process.env.FENCE_SPREAD_OUT, JSON.stringify(boxes.map((s) => s.sandboxId)))
  } finally {
    await Promise.all(boxes.map((s) => s.kill()))
  }
  for (const s of boxes) assert.equal(await Sandbox.connect(s.sandboxId, opts).then(() => 'alive', () => 'gone'), 'gone')
})
