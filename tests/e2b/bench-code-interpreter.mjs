// bench-code-interpreter.mjs: latency of @e2b/code-interpreter against the
// code-interpreter template: Sandbox.create() and the first runCode('1+1')
// after it (the kernel started with the sandbox or not), then the steady
// state runCode('1+1') round trip in one sandbox.
// Not part of the test run. Run through run.sh (which starts a daemon):
//   ./run.sh --bench-ci
//   ITERATIONS=30 ROUNDS=500 ./run.sh --bench-ci
// PAUSE_MS waits that long before each create (a warm pool's refill, which
// starts a kernel, takes seconds: back to back, creates outrun a pool of 1).
import { Sandbox } from '@e2b/code-interpreter'

const iterations = Number(process.env.ITERATIONS || 10)
const rounds = Number(process.env.ROUNDS || 200)
const pauseMs = Number(process.env.PAUSE_MS || 0)

function pct(sorted, p) {
  // Nearest-rank percentile.
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[i]
}
const fmt = (ms) => `${ms.toFixed(1)} ms`
function report(name, v) {
  const s = [...v].sort((a, b) => a - b)
  console.log(`  ${name.padEnd(22)} p50 ${fmt(pct(s, 50)).padStart(9)}  p99 ${fmt(pct(s, 99)).padStart(9)}  max ${fmt(s[s.length - 1]).padStart(9)}`)
}

const rows = { create: [], 'first runCode': [], 'create + first runCode': [] }
for (let i = 0; i <= iterations; i++) {
  if (pauseMs > 0) await new Promise((r) => setTimeout(r, pauseMs))
  const t0 = performance.now()
  const s = await Sandbox.create()
  const t1 = performance.now()
  const r = await s.runCode('1+1')
  const t2 = performance.now()
  if (r.text !== '2') throw new Error(`unexpected result ${JSON.stringify(r)}`)
  await s.kill()
  if (i === 0) continue // warm-up, not counted
  rows.create.push(t1 - t0)
  rows['first runCode'].push(t2 - t1)
  rows['create + first runCode'].push(t2 - t0)
}
console.log(`code-interpreter, ${iterations} sandboxes (sequential${pauseMs ? `, ${pauseMs} ms apart` : ''}):`)
for (const [k, v] of Object.entries(rows)) report(k, v)

const s = await Sandbox.create()
await s.runCode('1+1')
const rt = []
for (let i = 0; i < rounds; i++) {
  const t0 = performance.now()
  const r = await s.runCode('1+1')
  rt.push(performance.now() - t0)
  if (r.text !== '2') throw new Error(`unexpected result ${JSON.stringify(r)}`)
}
await s.kill()
console.log(`steady state, ${rounds} runCode('1+1') in one sandbox:`)
report('runCode', rt)
