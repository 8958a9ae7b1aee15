// files.*: read and write in every format, listing, stat, directories,
// remove, rename, watch, gzip, signed upload/download URLs.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { FileNotFoundError, FileType, FilesystemEventType } from 'e2b'
import { create, sleep, waitFor } from '../helpers.mjs'

test('write and read text, bytes, blob and stream', async (t) => {
  const s = await create(t)
  const info = await s.files.write('hello.txt', 'hello world')
  assert.equal(info.path, '/home/user/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.equal(await s.files.read('/home/user/hello.txt'), 'hello world')
  assert.equal((await s.commands.run('cat hello.txt')).stdout, 'hello world')

  const bytes = new Uint8Array(256).map((_, i) => i)
  await s.files.write('/tmp/bin', bytes.buffer)
  assert.deepEqual(await s.files.read('/tmp/bin', { format: 'bytes' }), bytes)

  const blob = await s.files.read('/tmp/bin', { format: 'blob' })
  assert.ok(blob instanceof Blob)
  assert.deepEqual(new Uint8Array(await blob.arrayBuffer()), bytes)
  await s.files.write('/tmp/fromblob', new Blob(['blob data']))
  assert.equal(await s.files.read('/tmp/fromblob'), 'blob data')

  const big = 'x'.repeat(5 * 1024 * 1024)
  await s.files.write('/tmp/big', big)
  const stream = await s.files.read('/tmp/big', { format: 'stream' })
  let n = 0
  for await (const chunk of stream) n += chunk.length
  assert.equal(n, big.length)

  // An upload from a stream (octet-stream upload).
  const up = new ReadableStream({
    start(c) {
      c.enqueue(new TextEncoder().encode('streamed '))
      c.enqueue(new TextEncoder().encode('upload'))
      c.close()
    },
  })
  await s.files.write('/tmp/streamed', up)
  assert.equal(await s.files.read('/tmp/streamed'), 'streamed upload')

  // Empty files and overwrite.
  await s.files.write('/tmp/empty', '')
  assert.equal(await s.files.read('/tmp/empty'), '')
  assert.equal((await s.files.read('/tmp/empty', { format: 'bytes' })).length, 0)
  await s.files.write('hello.txt', 'short')
  assert.equal(await s.files.read('hello.txt'), 'short')

  await assert.rejects(s.files.read('/nope/missing'), FileNotFoundError)
  await assert.rejects(s.files.read('/tmp'), (e) => e.name !== 'FileNotFoundError')
})

test('writeFiles writes several files, creating parents, owned by the user', async (t) => {
  const s = await create(t)
  const infos = await s.files.writeFiles([
    { path: 'a/b/one.txt', data: 'one' },
    { path: '/tmp/multi/two.txt', data: 'two' },
    { path: '/home/user/three.bin', data: new Uint8Array([1, 2, 3]).buffer },
  ])
  assert.deepEqual(infos.map((i) => i.path), ['/home/user/a/b/one.txt', '/tmp/multi/two.txt', '/home/user/three.bin'])
  assert.equal(await s.files.read('a/b/one.txt'), 'one')
  assert.equal(await s.files.read('/tmp/multi/two.txt'), 'two')
  const own = await s.commands.run('stat -c "%U:%G %a" a a/b a/b/one.txt /tmp/multi/two.txt')
  assert.equal(own.stdout, 'user:user 755\nuser:user 755\nuser:user 644\nuser:user 644\n')

  // As root.
  await s.files.write('/root/secret', 'r', { user: 'root' })
  assert.equal((await s.commands.run('stat -c %U /root/secret', { user: 'root' })).stdout, 'root\n')
  assert.equal(await s.files.read('/root/secret', { user: 'root' }), 'r')
})

test('parents missing outside the home are created for the user, never through a symlink', async (t) => {
  const s = await create(t)
  // E2B's own test writes to /0/multi_test_file{i}.txt: / is root's.
  const infos = await s.files.write([
    { path: '/0/multi_test_file0.txt', data: 'zero' },
    { path: '/0/sub/multi_test_file1.txt', data: 'one' },
  ])
  assert.deepEqual(infos.map((i) => i.path), ['/0/multi_test_file0.txt', '/0/sub/multi_test_file1.txt'])
  assert.equal(await s.files.read('/0/sub/multi_test_file1.txt'), 'one')
  await s.files.makeDir('/made/a/b')
  const own = await s.commands.run('stat -c "%U:%G" /0 /0/sub /0/multi_test_file0.txt /made /made/a/b')
  assert.equal(own.stdout, 'user:user\n'.repeat(5))
  // The user's /tmp/x -> /etc is not followed to make /etc/new.
  await s.commands.run('ln -s /etc /tmp/x')
  await assert.rejects(s.files.write('/tmp/x/new/f', 'evil'))
  assert.equal((await s.commands.run('test -e /etc/new || echo absent')).stdout, 'absent\n')
})

test('list with depth, exists, getInfo', async (t) => {
  const s = await create(t)
  await s.files.writeFiles([
    { path: '/tmp/tree/f1', data: '1' },
    { path: '/tmp/tree/d1/f2', data: '22' },
    { path: '/tmp/tree/d1/d2/f3', data: '333' },
  ])
  const l1 = await s.files.list('/tmp/tree')
  assert.deepEqual(l1.map((e) => [e.name, e.type]).sort(), [['d1', FileType.DIR], ['f1', FileType.FILE]])
  const l2 = await s.files.list('/tmp/tree', { depth: 2 })
  assert.deepEqual(l2.map((e) => e.path).sort(), ['/tmp/tree/d1', '/tmp/tree/d1/d2', '/tmp/tree/d1/f2', '/tmp/tree/f1'])
  const l3 = await s.files.list('/tmp/tree', { depth: 3 })
  assert.equal(l3.length, 5)
  await assert.rejects(s.files.list('/tmp/nothing'), FileNotFoundError)

  assert.equal(await s.files.exists('/tmp/tree/d1/f2'), true)
  assert.equal(await s.files.exists('/tmp/tree/zzz'), false)

  await s.files.write('info.txt', 'twelve bytes')
  const fi = await s.files.getInfo('info.txt')
  assert.equal(fi.name, 'info.txt')
  assert.equal(fi.path, '/home/user/info.txt')
  assert.equal(fi.type, FileType.FILE)
  assert.equal(fi.size, 12)
  assert.equal(fi.mode, 0o644)
  assert.equal(fi.permissions, '-rw-r--r--')
  assert.equal(fi.owner, 'user')
  assert.equal(fi.group, 'user')
  assert.ok(fi.modifiedTime instanceof Date && Math.abs(fi.modifiedTime.getTime() - Date.now()) < 120_000)
  assert.equal(fi.symlinkTarget, undefined)

  const di = await s.files.getInfo('/tmp/tree/d1')
  assert.equal(di.type, FileType.DIR)
  assert.equal(di.mode, 0o755)
  assert.equal(di.permissions, 'drwxr-xr-x')

  await s.commands.run('ln -s info.txt link.txt')
  const li = await s.files.getInfo('link.txt')
  assert.equal(li.symlinkTarget, '/home/user/info.txt')
  assert.equal(li.type, FileType.FILE)
  await assert.rejects(s.files.getInfo('/tmp/none'), FileNotFoundError)
})

test('makeDir, remove, rename', async (t) => {
  const s = await create(t)
  assert.equal(await s.files.makeDir('/tmp/x/y/z'), true)
  assert.equal(await s.files.makeDir('/tmp/x/y/z'), false)
  assert.equal((await s.files.getInfo('/tmp/x/y')).type, FileType.DIR)
  assert.equal((await s.commands.run('stat -c %U /tmp/x /tmp/x/y/z')).stdout, 'user\nuser\n')

  await s.files.write('/tmp/x/file', 'f')
  const moved = await s.files.rename('/tmp/x/file', '/tmp/x/y/renamed')
  assert.equal(moved.path, '/tmp/x/y/renamed')
  assert.equal(moved.name, 'renamed')
  assert.equal(await s.files.exists('/tmp/x/file'), false)
  assert.equal(await s.files.read('/tmp/x/y/renamed'), 'f')
  await assert.rejects(s.files.rename('/tmp/x/missing', '/tmp/x/other'), FileNotFoundError)

  await s.files.remove('/tmp/x')
  assert.equal(await s.files.exists('/tmp/x'), false)
  await s.files.remove('/tmp/x') // a missing path is fine
})

test('watchDir reports create, write, rename, remove (recursive)', async (t) => {
  const s = await create(t)
  await s.files.makeDir('/home/user/watched/sub')
  const events = []
  const w = await s.files.watchDir('/home/user/watched', (e) => events.push(e), { recursive: true, timeoutMs: 0 })
  t.after(() => w.stop())
  await s.files.write('/home/user/watched/a.txt', 'a')
  await s.files.write('/home/user/watched/sub/b.txt', 'b')
  await s.commands.run('mkdir -p /home/user/watched/sub/new && echo c > /home/user/watched/sub/new/c.txt')
  await s.files.rename('/home/user/watched/a.txt', '/home/user/watched/a2.txt')
  await s.files.remove('/home/user/watched/sub/b.txt')
  await s.commands.run('chmod 600 /home/user/watched/a2.txt')

  const has = (name, type) => events.some((e) => e.name === name && e.type === type)
  await waitFor(() =>
    has('a.txt', FilesystemEventType.CREATE) &&
    has('a.txt', FilesystemEventType.WRITE) &&
    has('sub/b.txt', FilesystemEventType.CREATE) &&
    has('sub/new', FilesystemEventType.CREATE) &&
    has('sub/new/c.txt', FilesystemEventType.CREATE) &&
    has('a.txt', FilesystemEventType.RENAME) &&
    has('a2.txt', FilesystemEventType.CREATE) &&
    has('sub/b.txt', FilesystemEventType.REMOVE) &&
    has('a2.txt', FilesystemEventType.CHMOD),
  10_000, 100).catch((e) => {
    throw new Error(`${e.message}; events: ${JSON.stringify(events)}`)
  })
  for (const e of events) assert.ok(Object.values(FilesystemEventType).includes(e.type), `event type ${e.type}`)
})

test('watchDir non-recursive ignores subdirectories; stop ends it; missing dir throws', async (t) => {
  const s = await create(t)
  await s.files.makeDir('/tmp/w/sub')
  const events = []
  let exited = false
  const w = await s.files.watchDir('/tmp/w', (e) => events.push(e), { onExit: () => { exited = true } })
  await s.files.write('/tmp/w/sub/deep.txt', 'x')
  await s.files.write('/tmp/w/top.txt', 'x')
  await waitFor(() => events.some((e) => e.name === 'top.txt'), 10_000)
  await sleep(300)
  assert.ok(!events.some((e) => e.name.includes('deep')), `events: ${JSON.stringify(events)}`)
  await w.stop()
  await waitFor(() => exited, 5_000)
  await assert.rejects(s.files.watchDir('/tmp/not-there', () => {}), FileNotFoundError)
})

test('gzip both ways', async (t) => {
  const s = await create(t)
  const text = 'compress me '.repeat(10_000)
  await s.files.write('/tmp/gz.txt', text, { gzip: true })
  assert.equal((await s.commands.run('wc -c < /tmp/gz.txt')).stdout.trim(), String(text.length))
  assert.equal(await s.files.read('/tmp/gz.txt', { gzip: true }), text)
  assert.deepEqual(
    await s.files.read('/tmp/gz.txt', { gzip: true, format: 'bytes' }),
    new TextEncoder().encode(text),
  )
  await s.files.write('/tmp/gz-empty', '', { gzip: true })
  assert.equal(await s.files.read('/tmp/gz-empty', { gzip: true }), '')
})

test('metadata is stored with the file', async (t) => {
  const s = await create(t)
  await s.files.write('/tmp/md.txt', 'm', { metadata: { Owner: 'tests', kind: 'note' } })
  const fi = await s.files.getInfo('/tmp/md.txt')
  assert.deepEqual(fi.metadata, { owner: 'tests', kind: 'note' })
})

test('uploadUrl and downloadUrl work with plain fetch()', async (t) => {
  const s = await create(t)
  const up = await s.uploadUrl('/home/user/uploaded.txt')
  const form = new FormData()
  form.append('file', new Blob(['via signed url']), 'uploaded.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.clone().text())
  assert.equal(await s.files.read('uploaded.txt'), 'via signed url')
  assert.equal((await s.commands.run('stat -c %U uploaded.txt')).stdout, 'user\n')

  const down = await s.downloadUrl('/home/user/uploaded.txt')
  const got = await fetch(down)
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'via signed url')

  const expiring = await s.downloadUrl('/home/user/uploaded.txt', { useSignatureExpiration: 60_000 })
  assert.equal(await (await fetch(expiring)).text(), 'via signed url')

  const asRoot = await s.uploadUrl('/root/r.txt', { user: 'root' })
  const form2 = new FormData()
  form2.append('file', new Blob(['root']), 'r.txt')
  assert.equal((await fetch(asRoot, { method: 'POST', body: form2 })).status, 200)

  // A tampered signature is refused.
  const bad = new URL(down)
  bad.searchParams.set('path', '/etc/shadow')
  const r = await fetch(bad)
  assert.equal(r.status, 401)
  assert.deepEqual(await r.json(), { code: 401, message: 'invalid signature' })
})

test('expired signed URL is refused with envd\'s message', async (t) => {
  const s = await create(t)
  await s.files.write('/tmp/e.txt', 'e')
  const url = await s.downloadUrl('/tmp/e.txt', { useSignatureExpiration: 1 })
  await sleep(2_100)
  const r = await fetch(url)
  assert.equal(r.status, 401)
  assert.deepEqual(await r.json(), { code: 401, message: 'signature is already expired' })
})
