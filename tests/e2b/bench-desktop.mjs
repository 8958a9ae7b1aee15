// bench-desktop.mjs: latency of @e2b/desktop against the desktop
// template: Desktop.create() (which starts Xvfb and XFCE through commands)
// and the first screenshot() after it, then the steady-state screenshot()
// round trip in one sandbox. "sandbox only" is a create of the same
// template by the plain e2b SDK (no X started): what a warm pool can save.
// Not part of the test run. Run through run.sh (which starts a daemon),
// with or without a warm pool of the template:
//   ./run.sh --bench-desktop
//   FENCE_E2B_SERVE_EXTRA='--warm-template desktop=2' ./run.sh --bench-desktop
//   ITERATIONS=10 ROUNDS=50 ./run.sh --bench-desktop
import { Sandbox } from '@e2b/desktop'
import { Sandbox as Plain } from 'e2b'

const iterations = Number(process.env.ITERATIONS || 5)
const rounds = Number(process.env.ROUNDS || 30)

function pct(sorted, p) {
  // Nearest-rank percentile.
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[i]
}
const fmt = (ms) => `${ms.toFixed(1)} ms`
function report(name, v) {
  const s = [...v].sort((a, b) => a - b)
  console.log(`  ${name.padEnd(26)} p50 ${fmt(pct(s, 50)).padStart(9)}  p99 ${fmt(pct(s, 99)).padStart(9)}  max ${fmt(s[s.length - 1]).padStart(9)}`)
}

const rows = { 'sandbox only': [], create: [], 'first screenshot': [], 'create + first screenshot': [] }
const refill = () => process.env.FENCE_E2B_SERVE_EXTRA ? new Promise((r) => setTimeout(r, Number(process.env.REFILL_MS || 15_000))) : null
for (let i = 0; i <= iterations; i++) {
  const p0 = performance.now()
  const plain = await Plain.create('desktop', { timeoutMs: 300_000 })
  const p1 = performance.now()
  await plain.kill()
  // A warm pool refills between creates, as between users' requests.
  await refill()
  const t0 = performance.now()
  const d = await Sandbox.create({ timeoutMs: 300_000 })
  const t1 = performance.now()
  const png = await d.screenshot()
  const t2 = performance.now()
  if (png.length < 100) throw new Error(`screenshot of ${png.length} bytes`)
  await d.kill()
  if (i === 0) continue // warm-up, not counted
  rows['sandbox only'].push(p1 - p0)
  rows.create.push(t1 - t0)
  rows['first screenshot'].push(t2 - t1)
  rows['create + first screenshot'].push(t2 - t0)
  await refill()
}
console.log(`desktop, ${iterations} sandboxes (sequential)${process.env.FENCE_E2B_SERVE_EXTRA ? `, daemon ${process.env.FENCE_E2B_SERVE_EXTRA}` : ''}:`)
for (const [k, v] of Object.entries(rows)) report(k, v)

const d = await Sandbox.create({ timeoutMs: 300_000 })
await d.screenshot()
const rt = []
for (let i = 0; i < rounds; i++) {
  const t0 = performance.now()
  await d.screenshot()
  rt.push(performance.now() - t0)
}
await d.kill()
console.log(`steady state, ${rounds} screenshot() in one sandbox (1024x768):`)
report('screenshot', rt)
