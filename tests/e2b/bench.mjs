// bench.mjs: latency of the SDK round trip Sandbox.create() →
// commands.run('echo hi') → kill(), sequentially, per template.
// Not part of the test run. Run through run.sh (which starts a daemon):
//   ./run.sh --bench            # 20 iterations of base and minimal
//   ITERATIONS=50 TEMPLATES=base ./run.sh --bench
//   PAUSE_MS=1500 ./run.sh --bench   # round trips spaced, as an agent's usually are
import { Sandbox } from 'e2b'

const iterations = Number(process.env.ITERATIONS || 20)
// A pause before each round trip: back to back (the default) the machine
// is busy with the previous round trip's teardown and refills; spaced, a
// round trip meets an idle machine, as an interactive agent's does.
const pauseMs = Number(process.env.PAUSE_MS || 0)
const templates = (process.env.TEMPLATES || 'base,minimal').split(',')

function pct(sorted, p) {
  // Nearest-rank percentile.
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[i]
}

const fmt = (ms) => `${ms.toFixed(1)} ms`

for (const template of templates) {
  // One warm-up round, not counted.
  {
    const s = await Sandbox.create(template)
    await s.commands.run('echo hi')
    await s.kill()
  }
  const rows = { create: [], run: [], kill: [], total: [] }
  for (let i = 0; i < iterations; i++) {
    if (pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, pauseMs))
    const t0 = performance.now()
    const s = await Sandbox.create(template)
    const t1 = performance.now()
    const r = await s.commands.run('echo hi')
    const t2 = performance.now()
    if (r.stdout !== 'hi\n') throw new Error(`unexpected output ${JSON.stringify(r.stdout)}`)
    if (!(await s.kill())) throw new Error('kill returned false')
    const t3 = performance.now()
    rows.create.push(t1 - t0)
    rows.run.push(t2 - t1)
    rows.kill.push(t3 - t2)
    rows.total.push(t3 - t0)
  }
  console.log(`template ${template}, ${iterations} iterations (sequential${pauseMs > 0 ? `, ${pauseMs} ms apart` : ''}):`)
  for (const [k, v] of Object.entries(rows)) {
    const s = [...v].sort((a, b) => a - b)
    console.log(`  ${k.padEnd(7)} p50 ${fmt(pct(s, 50)).padStart(9)}  p99 ${fmt(pct(s, 99)).padStart(9)}  max ${fmt(s[s.length - 1]).padStart(9)}`)
  }
}
