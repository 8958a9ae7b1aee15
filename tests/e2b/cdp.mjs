// Headless Chromium on the host driven over the DevTools protocol, for
// the desktop stream tests: browser(t) starts it (killed at the end of the
// test) and returns {open(url) -> page}; a page has eval(expr) and
// probe(expr) (eval, null on an error while the page loads) and
// screenshot() (PNG bytes). The WebSocket client is undici's, which the
// e2b SDK already depends on.
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { WebSocket } from 'undici'
import { within } from './helpers.mjs'

export async function browser(t) {
  const dir = mkdtempSync(join(tmpdir(), 'fence-chromium-'))
  const proc = spawn('chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--remote-debugging-port=0', `--user-data-dir=${dir}`, '--window-size=1024,768', 'about:blank'],
  { stdio: ['ignore', 'ignore', 'pipe'], detached: true })
  const exited = new Promise((r) => proc.on('exit', r))
  t.after(async () => {
    // Chromium's helpers (zygote, crashpad) are in its process group.
    try { process.kill(-proc.pid, 'SIGKILL') } catch {}
    await exited
    rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 })
  })
  const endpoint = await within(new Promise((resolve, reject) => {
    proc.on('error', reject)
    proc.on('exit', (code) => reject(new Error(`chromium exited with ${code}`)))
    createInterface({ input: proc.stderr }).on('line', (l) => {
      const m = l.match(/DevTools listening on ws:\/\/([^/]+)\//)
      if (m) resolve(m[1])
    })
  }), 60_000, 'chromium start')
  return {
    async open(url) {
      const res = await fetch(`http://${endpoint}/json/new?about:blank`, { method: 'PUT' })
      const target = await res.json()
      const p = await page(t, target.webSocketDebuggerUrl)
      await p.send('Page.navigate', { url })
      return p
    },
  }
}

async function page(t, wsURL) {
  const ws = new WebSocket(wsURL)
  await within(new Promise((resolve, reject) => {
    ws.onopen = resolve
    ws.onerror = reject
  }), 30_000, 'the DevTools connection')
  t.after(() => ws.close())
  let next = 0
  const waiting = new Map()
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data)
    const w = waiting.get(m.id)
    if (!w) return
    waiting.delete(m.id)
    if (m.error) w.reject(new Error(m.error.message))
    else w.resolve(m.result)
  }
  const send = (method, params = {}) => {
    const id = ++next
    ws.send(JSON.stringify({ id, method, params }))
    return within(new Promise((resolve, reject) => waiting.set(id, { resolve, reject })), 30_000, method)
  }
  return {
    send,
    async eval(expression) {
      const r = await send('Runtime.evaluate', { expression, returnByValue: true })
      if (r.exceptionDetails) throw new Error(`${expression}: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`)
      return r.result.value
    },
    // probe is eval for polling while the page loads: an error (no
    // document yet, a context replaced by navigation) is null.
    async probe(expression) {
      return this.eval(expression).catch(() => null)
    },
    async screenshot() {
      const r = await send('Page.captureScreenshot', { format: 'png' })
      return Buffer.from(r.data, 'base64')
    },
  }
}
