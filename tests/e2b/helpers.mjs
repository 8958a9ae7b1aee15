// Shared helpers for the SDK tests. Everything the tests need from the
// environment comes from run.sh: E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL.
import { Sandbox } from 'e2b'

export const TEMPLATE = process.env.FENCE_E2B_TEMPLATE || 'base'

// BACKEND is the daemon's default isolation backend (run.sh --backend):
// every sandbox a test makes without metadata fence.backend runs on it.
// A test that must expect something else on one backend says so where it
// does, with the reason (docs/GVISOR.md lists them).
export const BACKEND = process.env.FENCE_E2B_BACKEND || 'native'

// Options for every SDK call: short request timeouts so a server that hangs
// fails the test instead of stalling the run.
export const opts = { requestTimeoutMs: 30_000 }

// create returns a fresh sandbox from TEMPLATE (or the given template) and
// registers it for kill at the end of the test.
export async function create(t, extra = {}) {
  const template = extra.template ?? TEMPLATE
  const s = await Sandbox.create(template, { ...opts, timeoutMs: 120_000, ...extra })
  t.after(async () => {
    await s.kill().catch(() => {})
  })
  return s
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// waitFor polls fn until it returns a truthy value or timeoutMs passes.
export async function waitFor(fn, timeoutMs = 10_000, stepMs = 100) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`)
    await sleep(stepMs)
  }
}

// within fails if p does not settle within ms (used where a hang is the bug).
export function within(p, ms, what) {
  let timer
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise((_, rej) => {
      timer = setTimeout(() => rej(new Error(`${what} did not settle within ${ms} ms`)), ms)
    }),
  ])
}
