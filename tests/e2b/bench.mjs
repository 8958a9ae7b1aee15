// bench.mjs: latency of the SDK round trip Sandbox.create() →
// commands.run('echo hi') → kill(), sequentially, per template, with its
// peer (bwrap running /bin/true in the template's root filesystem) timed
// between the round trips of the same run, and the ratio of the medians.
// Not part of the test run. Run through run.sh (which starts a daemon):
//   ./run.sh --bench            # 20 iterations of base and minimal
//   ITERATIONS=50 TEMPLATES=base ./run.sh --bench
//   PAUSE_MS=1500 ./run.sh --bench   # round trips spaced, as an agent's usually are
//   PEER=0 ./run.sh --bench          # without the bwrap peer
//
// The run phase is split as the SDK sees it: the start event (the request
// through the daemon's proxy to the agent, the agent's fork and exec, the
// stream's first message back), the first output, and the end event (the
// command's run and exit, the end of the stream). New connections are
// counted from undici's diagnostics channel: the HTTP connections the SDK
// opened per round trip (a reused keep-alive connection opens none).
import { spawnSync } from 'node:child_process'
import diagnostics from 'node:diagnostics_channel'
import { existsSync } from 'node:fs'
import { Sandbox } from 'e2b'

const iterations = Number(process.env.ITERATIONS || 20)
// A pause before each round trip: back to back (the default) the machine
// is busy with the previous round trip's teardown and refills; spaced, a
// round trip meets an idle machine, as an interactive agent's does.
const pauseMs = Number(process.env.PAUSE_MS || 0)
const templates = (process.env.TEMPLATES || 'base,minimal').split(',')
const templatesDir = process.env.FENCE_TEMPLATES_DIR || '/var/lib/fence/templates'
const withPeer = process.env.PEER !== '0' && process.getuid?.() === 0 && spawnSync('bwrap', ['--version']).status === 0

let connections = 0
diagnostics.subscribe('undici:client:connected', () => { connections++ })

function pct(sorted, p) {
  // Nearest-rank percentile.
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[i]
}

const fmt = (ms) => `${ms.toFixed(1)} ms`
const median = (v) => pct([...v].sort((a, b) => a - b), 50)

// bwrapTrue runs the peer once, as `fence bench --peers` does, and returns
// its wall time in ms.
function bwrapTrue(rootfs) {
  const t0 = performance.now()
  const r = spawnSync('bwrap', ['--unshare-all', '--die-with-parent', '--ro-bind', rootfs, '/',
    '--proc', '/proc', '--dev', '/dev', '/bin/true'])
  if (r.status !== 0) throw new Error(`bwrap: ${r.status} ${r.stderr}`)
  return performance.now() - t0
}

async function roundTrip(template, rows) {
  const c0 = connections
  const t0 = performance.now()
  const s = await Sandbox.create(template)
  const t1 = performance.now()
  let tOut = 0
  let stdout = ''
  // run() is start() then wait(): the handle comes back at the start event.
  const h = await s.commands.run('echo hi', {
    background: true,
    onStdout: (d) => { stdout += d; if (!tOut) tOut = performance.now() },
  })
  const tStart = performance.now()
  const r = await h.wait()
  const t2 = performance.now()
  if (r.stdout !== 'hi\n' || stdout !== 'hi\n') throw new Error(`unexpected output ${JSON.stringify(r.stdout)}`)
  if (!(await s.kill())) throw new Error('kill returned false')
  const t3 = performance.now()
  if (!rows) return
  rows.create.push(t1 - t0)
  rows.run.push(t2 - t1)
  rows['  start'].push(tStart - t1)
  rows['  output'].push((tOut || t2) - tStart)
  rows['  end'].push(t2 - (tOut || tStart))
  rows.kill.push(t3 - t2)
  rows.total.push(t3 - t0)
  rows.conns.push(connections - c0)
}

for (const template of templates) {
  const rootfs = `${templatesDir}/${template}/rootfs`
  const peer = withPeer && existsSync(rootfs)
  await roundTrip(template) // one warm-up round, not counted
  if (peer) bwrapTrue(rootfs)
  const rows = { create: [], run: [], '  start': [], '  output': [], '  end': [], kill: [], total: [], conns: [] }
  const bwrap = []
  for (let i = 0; i < iterations; i++) {
    if (pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, pauseMs))
    await roundTrip(template, rows)
    if (peer) bwrap.push(bwrapTrue(rootfs))
  }
  console.log(`template ${template}, ${iterations} iterations (sequential${pauseMs > 0 ? `, ${pauseMs} ms apart` : ''}):`)
  for (const [k, v] of Object.entries(rows)) {
    const s = [...v].sort((a, b) => a - b)
    if (k === 'conns') {
      console.log(`  new HTTP connections per round trip: ${(v.reduce((a, b) => a + b, 0) / v.length).toFixed(2)}`)
      continue
    }
    console.log(`  ${k.padEnd(7)} p50 ${fmt(pct(s, 50)).padStart(9)}  p99 ${fmt(pct(s, 99)).padStart(9)}  max ${fmt(s[s.length - 1]).padStart(9)}`)
  }
  if (peer) {
    const b = median(bwrap)
    console.log(`  bwrap /bin/true p50 ${fmt(b)} (alternated with the round trips); round trip / bwrap ${(median(rows.total) / b).toFixed(2)}x`)
  }
}
