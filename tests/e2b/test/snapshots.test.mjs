// Snapshots, forks and the filesystem-only pause through the SDK, as E2B's
// own tests use them (snapshot-api, fork, lifecyclePayload), and fence's
// checkpoint/diff/rewind extension over plain HTTP.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { Sandbox, SandboxError, SandboxNotFoundError, InvalidArgumentError } from 'e2b'
import { BACKEND, create, opts, sleep, waitFor } from '../helpers.mjs'

const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY

async function call(method, path, body) {
  const res = await fetch(api + path, {
    method,
    headers: { 'X-API-Key': key, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

// running counts the sandbox's processes whose command line is cmdline
// (the base template has no pgrep).
async function running(sbx, cmdline) {
  const r = await sbx.commands.run(
    `for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^${cmdline} *$' || true`)
  return Number(r.stdout.trim())
}

async function track(t, sbx) {
  t.after(async () => {
    await sbx.kill().catch(() => {})
  })
  return sbx
}

test('createSnapshot: sandboxes from it see its files, independently; list, names, delete', async (t) => {
  const sbx = await create(t, { envs: { SRC: 'src' } })
  await sbx.files.makeDir('/home/user/app/sub')
  await sbx.files.write('/home/user/app/sub/a.txt', 'from the snapshot')
  await sbx.commands.run('rm -f /home/user/.bashrc; echo x > /home/user/gone && rm /home/user/gone')
  const snap = await sbx.createSnapshot(opts)
  assert.ok(snap.snapshotId, 'a snapshot id')
  const name = `snap-${randomUUID().slice(0, 8)}`
  const named = await sbx.createSnapshot({ ...opts, name })
  t.after(async () => {
    await Sandbox.deleteSnapshot(snap.snapshotId, opts).catch(() => {})
    await Sandbox.deleteSnapshot(named.snapshotId, opts).catch(() => {})
  })
  assert.ok(named.names.some((n) => n.includes(name)), `names ${named.names}`)

  // The source runs on; its later writes are not in the snapshot.
  await sbx.files.write('/home/user/app/sub/a.txt', 'changed after')
  const a = await track(t, await Sandbox.create(snap.snapshotId, { ...opts, timeoutMs: 120_000 }))
  const b = await track(t, await Sandbox.create(named.snapshotId, { ...opts, timeoutMs: 120_000, envs: { NEW: 'new' } }))
  // The create's envs on top of the snapshot's.
  assert.equal((await a.commands.run('echo $SRC-$NEW')).stdout, 'src-\n')
  assert.equal((await b.commands.run('echo $SRC-$NEW')).stdout, 'src-new\n')
  assert.equal(await a.files.read('/home/user/app/sub/a.txt'), 'from the snapshot')
  assert.equal(await b.files.read('/home/user/app/sub/a.txt'), 'from the snapshot')
  assert.equal((await a.commands.run('test -e /home/user/.bashrc && echo there || echo gone')).stdout, 'gone\n')
  assert.notEqual(a.sandboxId, sbx.sandboxId)
  const info = await a.getInfo()
  assert.equal(info.templateId, snap.snapshotId.split(':')[0], 'templateId is the snapshot template\'s')
  // Independent: a write in one is not seen by the other, nor by the source.
  await a.files.write('/home/user/app/sub/a.txt', 'written in a')
  await a.files.write('/home/user/only-a', 'x')
  assert.equal(await b.files.read('/home/user/app/sub/a.txt'), 'from the snapshot')
  assert.equal(await b.files.exists('/home/user/only-a'), false)
  assert.equal(await sbx.files.read('/home/user/app/sub/a.txt'), 'changed after')

  // Lists: all, by sandbox, by name; an unknown name gives nothing.
  const page = Sandbox.listSnapshots(opts)
  assert.equal(page.hasNext, true)
  const all = await page.nextItems()
  assert.ok(all.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(all))
  const mine = await sbx.listSnapshots(opts).nextItems()
  assert.deepEqual(new Set(mine.map((s) => s.snapshotId)), new Set([snap.snapshotId, named.snapshotId]))
  const byName = await Sandbox.listSnapshots({ ...opts, name }).nextItems()
  assert.equal(byName.length, 1)
  assert.equal(byName[0].snapshotId, named.snapshotId)
  assert.deepEqual(await Sandbox.listSnapshots({ ...opts, name: 'no-such-snapshot' }).nextItems(), [])

  // Delete is safe while sandboxes made from it run; true once, then false.
  await a.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, opts), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, opts), false)
  assert.equal(await Sandbox.deleteSnapshot(named.snapshotId, opts), true)
  assert.equal(await b.files.read('/home/user/app/sub/a.txt'), 'from the snapshot', 'b runs on after the delete')
  await assert.rejects(Sandbox.create(named.snapshotId, opts), (e) => e instanceof SandboxError)
})

test('snapshot of a paused or unknown sandbox is not found; bad names are refused', async (t) => {
  const sbx = await create(t)
  await sbx.pause(opts)
  await assert.rejects(sbx.createSnapshot(opts), SandboxNotFoundError)
  await assert.rejects(Sandbox.createSnapshot('nosuchsandbox', opts), SandboxNotFoundError)
  await sbx.connect(opts)
  const r = await call('POST', `/sandboxes/${sbx.sandboxId}/snapshots`, { name: '../Bad Name' })
  assert.equal(r.status, 400)
})

test('fork: new IDs, files shared, writes and processes independent', async (t) => {
  const sbx = await create(t, { envs: { FORK_ENV: 'inherited' }, metadata: { who: 'parent' } })
  await sbx.files.write('/home/user/shared.txt', 'parent')
  await sbx.commands.run('sleep 3600', { background: true })
  const [f] = await sbx.fork(opts)
  assert.ok(f instanceof Sandbox, `${f}`)
  await track(t, f)
  assert.notEqual(f.sandboxId, sbx.sandboxId)
  assert.equal(await f.isRunning(), true)
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await f.files.read('/home/user/shared.txt'), 'parent')
  assert.equal((await f.commands.run('echo $FORK_ENV')).stdout, 'inherited\n')
  assert.equal((await f.getInfo()).metadata.who, 'parent')
  // Backend difference: native forks reboot on the parent's files, so the
  // parent's processes are not in the fork; gVisor forks restore the
  // parent's memory, processes included, as E2B's forks do.
  assert.equal(await running(f, 'sleep 3600'), BACKEND === 'gvisor' ? 1 : 0)
  assert.equal(await running(sbx, 'sleep 3600'), 1)
  await f.files.write('/home/user/shared.txt', 'fork')
  await f.commands.run('sleep 1234', { background: true })
  assert.equal(await sbx.files.read('/home/user/shared.txt'), 'parent')
  assert.equal(await running(sbx, 'sleep 1234'), 0)
  assert.equal(await running(f, 'sleep 1234'), 1)
  // js 2.51 sends {}: the server's default timeout of 15 s applies.
  const left = (await f.getInfo()).endAt.getTime() - Date.now()
  assert.ok(left > 0 && left <= 15_500, `fork's time left ${left} ms`)

  const two = await Sandbox.fork(sbx.sandboxId, { ...opts, count: 2, timeoutMs: 60_000 })
  for (const x of two) await track(t, x)
  assert.equal(two.length, 2)
  assert.ok(two.every((x) => x instanceof Sandbox))
  assert.equal(new Set([sbx.sandboxId, ...two.map((x) => x.sandboxId)]).size, 3)
  await two[0].files.write('/home/user/shared.txt', 'zero')
  assert.equal(await two[1].files.read('/home/user/shared.txt'), 'parent')

  await assert.rejects(sbx.fork({ ...opts, count: 0 }), (e) => e instanceof InvalidArgumentError || e instanceof SandboxError)
  await sbx.pause(opts)
  await assert.rejects(sbx.fork(opts), (e) => e instanceof SandboxError)
  await sbx.kill()
  await assert.rejects(Sandbox.fork(sbx.sandboxId, opts), SandboxNotFoundError)
})

test('pause without memory keeps the files and reboots; kill of such a pause', async (t) => {
  const sbx = await create(t, { envs: { COLD: 'yes' } })
  await sbx.files.write('/home/user/kept.txt', 'kept')
  const boot = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
  await sbx.commands.run('sleep 3600', { background: true })
  assert.equal(await sbx.pause({ ...opts, keepMemory: false }), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal((await sbx.getInfo()).state, 'paused')
  await sbx.connect(opts)
  assert.equal(await sbx.isRunning(), true)
  assert.equal(await sbx.files.read('/home/user/kept.txt'), 'kept')
  assert.equal((await sbx.commands.run('echo $COLD')).stdout, 'yes\n')
  assert.equal(await running(sbx, 'sleep 3600'), 0, 'processes did not survive')
  // A reboot: each boot of a sandbox has its own boot_id.
  assert.match(boot, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$/)
  assert.notEqual((await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout, boot, 'boot_id after the reboot')
  // onResume 'reboot' (memory false) of a pause without memory: a cold
  // boot, as any resume of it.
  await sbx.commands.run('sleep 3600', { background: true })
  await sbx.pause({ ...opts, keepMemory: false })
  await sbx.connect({ ...opts, onResume: 'reboot' })
  assert.equal(await sbx.files.read('/home/user/kept.txt'), 'kept')
  assert.equal(await running(sbx, 'sleep 3600'), 0, 'processes did not survive the reboot')
  // Of a pause with memory: refused (400), never a silent memory restore.
  await sbx.pause(opts)
  await assert.rejects(sbx.connect({ ...opts, onResume: 'reboot' }),
    (e) => (e instanceof InvalidArgumentError || e instanceof SandboxError) && /sandbox_memory_override_disabled/.test(e.message))
  assert.equal((await sbx.getInfo()).state, 'paused')
  await sbx.connect(opts)
  await sbx.pause({ ...opts, keepMemory: false })
  await sbx.kill()
  await assert.rejects(Sandbox.connect(sbx.sandboxId, opts), SandboxNotFoundError)
})

test('lifecycle onTimeout pause without memory: paused at the deadline, files kept after connect', async (t) => {
  const sbx = await Sandbox.create({ ...opts, timeoutMs: 3_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
  await track(t, sbx)
  await sbx.files.write('/home/user/f', 'before')
  const boot = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
  await waitFor(async () => (await sbx.getInfo()).state === 'paused', 20_000, 200)
  assert.equal(await sbx.isRunning(), false)
  await sbx.connect(opts)
  assert.equal(await sbx.files.read('/home/user/f'), 'before')
  assert.notEqual((await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout, boot, 'boot_id after the auto-pause')
  await assert.rejects(
    Sandbox.create({ ...opts, lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: true } }),
    (e) => e instanceof InvalidArgumentError || e instanceof SandboxError,
  )
})

test('checkpoint, diff and rewind (fence extension)', async (t) => {
  const sbx = await create(t, { envs: { KEEP: 'env' }, metadata: { m: '1' } })
  const id = sbx.sandboxId
  await sbx.files.write('/home/user/a.txt', 'one')
  let r = await call('POST', `/sandboxes/${id}/checkpoints`, { name: 'first' })
  assert.equal(r.status, 201, JSON.stringify(r.body))
  const cp1 = r.body
  assert.ok(cp1.checkpointID)
  await sbx.files.write('/home/user/a.txt', 'two!')
  await sbx.files.write('/home/user/b.txt', 'b')
  r = await call('POST', `/sandboxes/${id}/checkpoints`, {})
  const cp2 = r.body

  r = await call('GET', `/sandboxes/${id}/diff?from=${cp1.checkpointID}&to=${cp2.checkpointID}`)
  if (BACKEND === 'gvisor') {
    // Backend difference (diff is fence's, E2B has none): a gVisor
    // sandbox's writable layer is gVisor's own overlay file, whose changed
    // files fence cannot list; the diff is a 400 that says so.
    assert.equal(r.status, 400, JSON.stringify(r.body))
    assert.match(r.body.message, /not supported/)
  } else {
    assert.equal(r.status, 200)
    const byPath = Object.fromEntries(r.body.map((d) => [d.path, d]))
    assert.equal(byPath['/home/user/a.txt'].change, 'changed')
    assert.equal(byPath['/home/user/a.txt'].size, 4)
    assert.equal(byPath['/home/user/a.txt'].oldSize, 3)
    assert.match(byPath['/home/user/a.txt'].sha256, /^[0-9a-f]{64}$/)
    assert.equal(byPath['/home/user/b.txt'].change, 'added')
    assert.equal(Object.keys(byPath).length, 2, JSON.stringify(r.body))
    r = await call('GET', `/sandboxes/${id}/diff`) // since create, until now
    const since = Object.fromEntries(r.body.map((d) => [d.path, d]))
    assert.equal(since['/home/user/b.txt'].change, 'added')
    assert.equal(since['/etc/hosts'], undefined, 'files fence wrote at create are not changes')
  }

  await sbx.commands.run('sleep 3600', { background: true })
  r = await call('POST', `/sandboxes/${id}/rewind`, { checkpointID: 'first' })
  assert.equal(r.status, 200, JSON.stringify(r.body))
  assert.equal(await sbx.files.read('/home/user/a.txt'), 'one', 'the old handle works after a rewind')
  assert.equal(await sbx.files.exists('/home/user/b.txt'), false)
  assert.equal((await sbx.commands.run('echo $KEEP')).stdout, 'env\n')
  assert.equal(await running(sbx, 'sleep 3600'), 0, 'processes started after the checkpoint are gone after a rewind')
  assert.equal((await sbx.getInfo()).metadata.m, '1')
  r = await call('GET', `/sandboxes/${id}/checkpoints`)
  assert.deepEqual(r.body.map((c) => c.checkpointID), [cp1.checkpointID, cp2.checkpointID])
  assert.equal((await call('POST', `/sandboxes/${id}/rewind`, { checkpointID: 'nope' })).status, 404)
  assert.equal((await call('POST', `/sandboxes/nosuch/checkpoints`, {})).status, 404)
})

test('autoCheckpoint: a checkpoint before each command, so a step can be undone', async (t) => {
  const r = await call('POST', '/sandboxes', { templateID: 'base', timeout: 120, autoCheckpoint: true })
  assert.equal(r.status, 201, JSON.stringify(r.body))
  const sbx = await track(t, await Sandbox.connect(r.body.sandboxID, opts))
  await sbx.commands.run('echo precious > /home/user/p')
  await sbx.commands.run('rm /home/user/p')
  const cps = (await call('GET', `/sandboxes/${sbx.sandboxId}/checkpoints`)).body
  assert.ok(cps.length >= 2 && cps.every((c) => c.auto), JSON.stringify(cps))
  const before = cps[cps.length - 1] // taken just before the rm
  await call('POST', `/sandboxes/${sbx.sandboxId}/rewind`, { checkpointID: before.checkpointID })
  assert.equal(await sbx.files.read('/home/user/p'), 'precious\n')
})
