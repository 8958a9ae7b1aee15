// Serves a directory from run.sh's registry namespace, where the fake
// registries and sites of the tests live: its REGISTRY_IP is on the
// daemon's build allowlist, its DENIED_IP on no allowlist.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { chmodSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import { within } from '../helpers.mjs'

// serveInRegistryNS fills a new directory with fill(dir) and serves it on
// port in the registry namespace until t ends; requests collects the
// server's log lines ("REQ <ip> <method> <path> <status>"). Without the
// namespace it skips t and returns null, or fails t under CI.
export async function serveInRegistryNS(t, { port, what, fill }) {
  const ns = process.env.FENCE_E2B_REGISTRY_NS
  if (!ns) {
    if (process.env.CI) assert.fail('run.sh made no registry namespace (needs root and ip)')
    t.skip('no registry namespace (run.sh as root)')
    return null
  }
  const dir = mkdtempSync(join(tmpdir(), 'fence-fake-'))
  chmodSync(dir, 0o755)
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  fill(dir)
  const srv = spawn('ip', ['netns', 'exec', ns, process.execPath, fileURLToPath(new URL('./server.mjs', import.meta.url)), dir, String(port)],
    { stdio: ['ignore', 'pipe', 'inherit'] })
  t.after(() => srv.kill())
  const requests = []
  let ready
  const listening = new Promise((r) => { ready = r })
  createInterface({ input: srv.stdout }).on('line', (l) => {
    if (l === 'listening') ready()
    else requests.push(l)
  })
  await within(listening, 10_000, what)
  return { ip: process.env.FENCE_E2B_REGISTRY_IP, denied: process.env.FENCE_E2B_DENIED_IP, requests }
}
