// The SDK's Secret module against fence's /secrets routes: IDs, versions,
// lookup by ID and name, paging, exists/destroy, fill, and the errors.
// Only this file makes secrets; its tests run one after another.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { InvalidArgumentError, Secret, SecretError, SecretNotFoundError } from 'e2b'
import { opts } from '../helpers.mjs'

const run = Math.random().toString(36).slice(2, 8)
const idPattern = /^sec_[0-7][0-9a-hjkmnp-tv-z]{25}$/

// raw calls the API without the SDK, to see the wire.
async function raw(method, path, body) {
  const res = await fetch(`${process.env.E2B_API_URL}${path}`, {
    method,
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { res, text, json: text ? JSON.parse(text) : undefined }
}

async function destroyAll() {
  const p = Secret.list({ ...opts, limit: 100 })
  while (p.hasNext) {
    for (const s of await p.nextItems()) await Secret.destroy(s.secretId, opts)
  }
}

test('create, getInfo by ID and name, update, destroy', async () => {
  const name = `openai-key-${run}`
  const s = await Secret.create(name, 'sk-test-value', { ...opts, metadata: { team: 'ml' } })
  assert.match(s.secretId, idPattern)
  assert.equal(s.name, name)
  assert.equal(s.version, 1)
  assert.deepEqual(s.metadata, { team: 'ml' })
  assert.ok(s.createdAt instanceof Date && !isNaN(s.createdAt))
  assert.ok(!('value' in s))

  // The wire has no value key either, and is never cached.
  const r = await raw('GET', `/secrets/${s.secretId}`)
  assert.equal(r.res.status, 200)
  assert.equal(r.res.headers.get('cache-control'), 'no-store')
  assert.ok(!('value' in r.json), r.text)
  assert.ok(!r.text.includes('sk-test-value'))

  for (const sel of [s.secretId, name, name.toUpperCase()]) {
    const got = await Secret.getInfo(sel, opts)
    assert.equal(got.secretId, s.secretId, sel)
    assert.equal(got.version, 1)
  }

  const u = await Secret.update(name, 'sk-test-value-2', opts)
  assert.equal(u.version, 2)
  assert.equal(u.secretId, s.secretId)
  assert.deepEqual(u.metadata, { team: 'ml' }, 'metadata kept when the update omits it')
  const u3 = await Secret.update(s.secretId, 'v3', { ...opts, metadata: {} })
  assert.equal(u3.version, 3)
  assert.deepEqual(u3.metadata, {})

  assert.equal(await Secret.exists(name, opts), true)
  assert.equal(await Secret.destroy(s.secretId, opts), true)
  assert.equal(await Secret.exists(name, opts), false)
  assert.equal(await Secret.exists(s.secretId, opts), false)
  assert.equal(await Secret.destroy(name, opts), false)
})

test('list pages: 2 then 1, hasNext false at the end', async () => {
  await destroyAll()
  const made = []
  for (const i of [1, 2, 3]) made.push((await Secret.create(`page-${run}-${i}`, 'v', opts)).secretId)
  const p = Secret.list({ ...opts, limit: 2 })
  const first = await p.nextItems()
  assert.equal(first.length, 2)
  assert.equal(p.hasNext, true)
  const second = await p.nextItems()
  assert.equal(second.length, 1)
  assert.equal(p.hasNext, false)
  assert.deepEqual([...first, ...second].map((s) => s.secretId).sort(), made.sort())
  await destroyAll()
})

test('fill makes the placeholder', () => {
  assert.equal(Secret.fill('openai-api-key'), '${e2b.secrets.openai-api-key}')
  assert.throws(() => Secret.fill(''), InvalidArgumentError)
  assert.throws(() => Secret.fill('a}b'), InvalidArgumentError)
})

test('errors: not found, taken name, bad input; fixed messages', async () => {
  const missing = `missing-${run}`
  await assert.rejects(Secret.getInfo(missing, opts), SecretNotFoundError)
  await assert.rejects(Secret.update(missing, 'v', opts), SecretNotFoundError)

  const name = `taken-${run}`
  await Secret.create(name, 'v', opts)
  await assert.rejects(Secret.create(name.toUpperCase(), 'v', opts), (e) => {
    assert.ok(e instanceof SecretError, `${e?.name}: ${e?.message}`)
    assert.match(e.message, /409/)
    assert.match(e.message, /Secret cannot be modified in its current state/)
    return true
  })
  await assert.rejects(Secret.create(`sec_${run}`, 'v', opts), /400: Invalid secrets request/)
  await assert.rejects(Secret.create(`big-${run}`, 'x'.repeat(64 * 1024 + 1), opts), /400: Invalid secrets request/)
  await assert.rejects(Secret.getInfo('sec_notanid', opts), /400: Invalid secrets request/)

  const r = await raw('POST', '/secrets', { name: `bad.${run}`, value: 'echo-this-value' })
  assert.equal(r.res.status, 400)
  assert.equal(r.res.headers.get('cache-control'), 'no-store')
  assert.deepEqual(r.json, { code: 400, message: 'Invalid secrets request' })
  assert.ok(!r.text.includes('echo-this-value') && !r.text.includes(run))
  assert.equal(await Secret.destroy(name, opts), true)
})

test('downloads of a sandbox fence never knew: 404', async () => {
  const r = await raw('GET', '/sandboxes/neverknown0000000000/downloads')
  assert.equal(r.res.status, 404)
  assert.equal(r.json.code, 404)
})
