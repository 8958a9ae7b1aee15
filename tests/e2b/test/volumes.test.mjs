// The SDK's Volume class against fence's /volumes and /volumecontent
// routes: create, the content API with the volume's token, a volume
// mounted in two sandboxes that see each other's writes, delete in use,
// delete, and the errors. run.sh points E2B_VOLUME_API_URL at the daemon.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'
import { TEMPLATE, create, opts } from '../helpers.mjs'

const run = Math.random().toString(36).slice(2, 8)

test('the content API: write, read, list, stat, mkdir, metadata, remove', async (t) => {
  const vol = await Volume.create(`files-${run}`, opts)
  t.after(() => Volume.destroy(vol.volumeId, opts).catch(() => {}))
  assert.match(vol.volumeId, /^[0-9a-f-]{36}$/)
  assert.equal(vol.name, `files-${run}`)

  const w = await vol.writeFile('/notes/a.txt', 'hello volume', { uid: 1000, gid: 1000, mode: 0o644, force: true })
  assert.equal(w.type, 'file')
  assert.equal(w.uid, 1000)
  assert.equal(w.gid, 1000)
  assert.equal(w.mode, 0o644)
  assert.equal(w.size, 12)
  assert.ok(w.mtime instanceof Date && !isNaN(w.mtime))
  assert.equal(await vol.readFile('/notes/a.txt'), 'hello volume')
  assert.deepEqual(await vol.readFile('/notes/a.txt', { format: 'bytes' }), new TextEncoder().encode('hello volume'))
  await assert.rejects(vol.writeFile('/notes/a.txt', 'again'), VolumeError) // exists, no force

  const d = await vol.makeDir('/x/y', { force: true })
  assert.equal(d.type, 'directory')
  await assert.rejects(vol.makeDir('/x/y'), VolumeError)
  const names = (await vol.list('/')).map((e) => e.name).sort()
  assert.deepEqual(names, ['notes', 'x'])
  assert.equal((await vol.list('/', { depth: 3 })).length, 4)
  assert.equal((await vol.getInfo('/notes')).type, 'directory')
  assert.equal(await vol.exists('/notes/a.txt'), true)
  assert.equal(await vol.exists('/nope'), false)
  await assert.rejects(vol.getInfo('/nope'), VolumePathNotFoundError)
  await assert.rejects(vol.readFile('/nope'), VolumePathNotFoundError)

  const m = await vol.updateMetadata('/notes/a.txt', { mode: 0o600 })
  assert.equal(m.mode, 0o600)
  await vol.remove('/x')
  assert.equal(await vol.exists('/x/y'), false)
  await assert.rejects(vol.remove('/x'), VolumePathNotFoundError)

  // The token of GET /volumes/{id} is new each time, and works.
  const again = await Volume.connect(vol.volumeId, opts)
  assert.notEqual(again.token, vol.token)
  assert.equal(await again.readFile('/notes/a.txt'), 'hello volume')
  const info = await Volume.getInfo(vol.volumeId, opts)
  assert.equal(info.name, vol.name)
  assert.ok((await Volume.list(opts)).some((v) => v.volumeId === vol.volumeId && v.name === vol.name))
})

test('a volume mounted in two sandboxes: shared writes, delete in use, delete', async (t) => {
  const vol = await Volume.create(`shared-${run}`, opts)
  t.after(() => Volume.destroy(vol.volumeId, opts).catch(() => {}))
  await vol.writeFile('/from-api.txt', 'written through the API')

  const a = await create(t, { volumeMounts: { '/mnt/data': vol } })
  const b = await create(t, { volumeMounts: { '/mnt/data': vol.name } })
  assert.equal((await a.commands.run('cat /mnt/data/from-api.txt')).stdout, 'written through the API')
  // The sandbox's user owns the volume and what it writes there.
  await a.commands.run('echo from-a > /mnt/data/a.txt')
  assert.equal((await a.commands.run('stat -c %U:%G /mnt/data /mnt/data/a.txt')).stdout, 'user:user\nuser:user\n')
  assert.equal((await b.commands.run('cat /mnt/data/a.txt')).stdout, 'from-a\n')
  await b.commands.run('echo from-b > /mnt/data/b.txt')
  assert.equal((await a.commands.run('cat /mnt/data/b.txt')).stdout, 'from-b\n')
  assert.equal(await vol.readFile('/b.txt'), 'from-b\n')
  const e = await vol.getInfo('/a.txt')
  assert.equal(e.uid, 1000)

  const infoA = await Sandbox.getInfo(a.sandboxId, opts)
  assert.deepEqual(infoA.volumeMounts, [{ name: vol.name, path: '/mnt/data' }])
  const listed = await Sandbox.list({ ...opts, query: { state: ['running'] } }).nextItems()
  assert.deepEqual(listed.find((s) => s.sandboxId === b.sandboxId)?.volumeMounts, [{ name: vol.name, path: '/mnt/data' }])

  await assert.rejects(Volume.destroy(vol.volumeId, opts), (err) => err instanceof VolumeError && /in use/.test(err.message))
  assert.equal(await vol.exists('/a.txt'), true)
  await a.kill()
  await assert.rejects(Volume.destroy(vol.volumeId, opts), VolumeError) // b still mounts it
  await b.kill()
  assert.equal(await Volume.destroy(vol.volumeId, opts), true)
  assert.equal(await Volume.destroy(vol.volumeId, opts), false)
  await assert.rejects(Volume.getInfo(vol.volumeId, opts), VolumeNotFoundError)
})

test('bad names, paths and unknown volumes are refused', async (t) => {
  await assert.rejects(Volume.create('bad name', opts), /Invalid volume name/)
  await assert.rejects(Volume.create('', opts), /Invalid volume name/)
  const vol = await Volume.create(`dup-${run}`, opts)
  t.after(() => Volume.destroy(vol.volumeId, opts).catch(() => {}))
  await assert.rejects(Volume.create(`dup-${run}`, opts), /already exists/)
  await assert.rejects(Volume.getInfo('00000000-0000-4000-8000-000000000000', opts), VolumeNotFoundError)
  await assert.rejects(Volume.getInfo('not-a-uuid', opts), VolumeError)
  await assert.rejects(Sandbox.create(TEMPLATE, { ...opts, volumeMounts: { '/mnt/data': `nosuch-${run}` } }), /volume 'nosuch-.*' not found/)
  await assert.rejects(Sandbox.create(TEMPLATE, { ...opts, volumeMounts: { 'relative': vol } }), /must be absolute/)
  await assert.rejects(vol.readFile('/../etc/passwd'), VolumeError)
  const forged = new Volume(vol.volumeId, vol.name, 'fvt1.forged.token', vol.domain)
  await assert.rejects(forged.list('/'), /invalid volume token/)
  assert.deepEqual(await vol.list('/'), [])
})
