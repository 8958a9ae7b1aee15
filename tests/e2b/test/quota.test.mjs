// Team quotas and request rates as the SDK sees them: over a limit the
// SDK raises its own RateLimitError. Each test runs a daemon of its own
// (the suite's daemon is shared by test files running in parallel, and
// its limits must not change under them), started with the daemon-wide
// defaults of the teams' limits.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync, chmodSync, mkdirSync, rmSync } from 'node:fs'
import { randomBytes } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import path from 'node:path'
import { RateLimitError, Sandbox } from 'e2b'
import { waitFor } from '../helpers.mjs'

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')
const templates = process.env.FENCE_TEMPLATES_DIR || '/var/lib/fence/templates'

// startDaemon runs `fence serve` with flags on a free port and returns the
// SDK options that reach it; it is stopped after the test.
async function startDaemon(t, flags) {
  mkdirSync('/var/tmp/fence-e2b', { recursive: true })
  const work = mkdtempSync('/var/tmp/fence-e2b/quota.')
  chmodSync(work, 0o711)
  const key = 'e2b_' + randomBytes(20).toString('hex')
  const proc = spawn(path.join(repo, 'bin/fence'), ['serve', '--addr', '127.0.0.1:0', '--data-dir', path.join(work, 'data'),
    '--templates-dir', templates, '--warm-pool', '0', ...flags], { env: { ...process.env, FENCE_API_KEY: key } })
  let out = ''
  proc.stdout.on('data', (b) => { out += b })
  proc.stderr.on('data', () => {})
  t.after(async () => {
    await new Promise((resolve) => { proc.once('exit', resolve); proc.kill('SIGTERM') })
    rmSync(work, { recursive: true, force: true })
  })
  const url = await waitFor(() => out.match(/serving the E2B API on (\S+)/)?.[1], 30_000)
  return { apiKey: key, apiUrl: url, sandboxUrl: url, requestTimeoutMs: 30_000 }
}

test('50 concurrent creates against a team limit of 10: 10 sandboxes, 40 RateLimitError', async (t) => {
  const o = await startDaemon(t, ['--team-max-sandboxes', '10'])
  const results = await Promise.allSettled(Array.from({ length: 50 }, () => Sandbox.create('minimal', o)))
  const ok = results.filter((r) => r.status === 'fulfilled').map((r) => r.value)
  const refused = results.filter((r) => r.status === 'rejected').map((r) => r.reason)
  assert.equal(ok.length, 10)
  assert.equal(refused.length, 40)
  for (const e of refused) {
    assert.ok(e instanceof RateLimitError, `${e?.name}: ${e?.message}`)
    assert.match(e.message, /maximum number of concurrent E2B sandboxes \(10\)/)
  }
  const running = await Sandbox.list(o).nextItems()
  assert.equal(running.length, 10)
  await ok[0].kill()
  const again = await Sandbox.create('minimal', o) // a kill gives its room back
  await Promise.all([again, ...ok.slice(1)].map((s) => s.kill()))
})

test('over its request rate a key gets RateLimitError', async (t) => {
  const o = await startDaemon(t, ['--team-rate', '0.01', '--team-burst', '2'])
  await Sandbox.list(o).nextItems()
  await Sandbox.list(o).nextItems()
  await assert.rejects(Sandbox.list(o).nextItems(), (e) => {
    assert.ok(e instanceof RateLimitError, `${e?.name}: ${e?.message}`)
    assert.match(e.message, /Rate limit exceeded/)
    return true
  })
})

test('over the team limit of snapshots createSnapshot raises RateLimitError', async (t) => {
  const o = await startDaemon(t, ['--team-max-snapshots', '1'])
  const sbx = await Sandbox.create('minimal', o)
  t.after(() => sbx.kill().catch(() => {}))
  const results = await Promise.allSettled([1, 2, 3].map(() => sbx.createSnapshot(o)))
  const ok = results.filter((r) => r.status === 'fulfilled')
  const refused = results.filter((r) => r.status === 'rejected').map((r) => r.reason)
  assert.equal(ok.length, 1)
  assert.equal(refused.length, 2)
  for (const e of refused) {
    assert.ok(e instanceof RateLimitError, `${e?.name}: ${e?.message}`)
    assert.match(e.message, /maximum number of snapshots \(1\)/)
  }
})
