// The unmodified @e2b/code-interpreter SDK against fence's code-interpreter
// template (default template name code-interpreter-v1, an alias).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const opts = { requestTimeoutMs: 60_000 }

async function create(t, extra = {}) {
  const s = await Sandbox.create({ ...opts, timeoutMs: 300_000, ...extra })
  t.after(async () => {
    await s.kill().catch(() => {})
  })
  return s
}

test('code interpreter: state, streams, results, errors', async (t) => {
  const s = await create(t)
  const t0 = Date.now()
  const first = await s.runCode('1+1')
  t.diagnostic(`first runCode after create: ${Date.now() - t0} ms`)
  assert.equal(first.text, '2')
  assert.equal(first.error, undefined)

  // State across calls, execution counts.
  const a = await s.runCode('x = 41')
  const b = await s.runCode('x + 1')
  assert.equal(b.text, '42')
  assert.ok(b.executionCount > a.executionCount, `counts ${a.executionCount} then ${b.executionCount}`)

  // stdout and stderr, through the callbacks and in the logs.
  const out = []
  const err = []
  const e = await s.runCode('import sys\nprint("hello out")\nprint("hello err", file=sys.stderr)', {
    onStdout: (m) => out.push(m.line),
    onStderr: (m) => err.push(m.line),
  })
  assert.deepEqual(e.logs.stdout.join(''), 'hello out\n')
  assert.deepEqual(e.logs.stderr.join(''), 'hello err\n')
  assert.equal(out.join(''), 'hello out\n')
  assert.equal(err.join(''), 'hello err\n')

  // Output streams while the code runs: the first line reaches the
  // callback before the code has printed the second (it waits for a file
  // the test creates only after seeing the first line).
  const seen = []
  const streamed = s.runCode(
    'import os, time\nprint("first", flush=True)\n' +
      'while not os.path.exists("/tmp/go"): time.sleep(0.05)\nprint("second")',
    {
      onStdout: async (m) => {
        seen.push(m.line)
        if (m.line === 'first\n') await s.files.write('/tmp/go', 'x')
      },
    },
  )
  const sr = await streamed
  assert.equal(sr.error, undefined)
  assert.deepEqual(seen, ['first\n', 'second\n'])

  // An exception: name, value and traceback; the kernel lives on.
  const ex = await s.runCode('def f():\n    raise ValueError("bad value 7")\nf()')
  assert.ok(ex.error, 'want an error')
  assert.equal(ex.error.name, 'ValueError')
  assert.equal(ex.error.value, 'bad value 7')
  const tb = ex.error.traceback.replace(/\x1b\[[0-9;]*m/g, '') // IPython colours it
  assert.match(tb, /ValueError/)
  assert.match(tb, /----> 3 f\(\)/)
  assert.equal((await s.runCode('x')).text, '41')

  // An error does not skip the next execution, even when the kernel is
  // slow to finish with it (here its event loop is held for a second
  // right after the cell).
  const slow = await s.runCode(
    'import asyncio, time\nasyncio.get_event_loop().call_soon(time.sleep, 1)\nraise ValueError("slow")',
  )
  assert.equal(slow.error?.name, 'ValueError')
  const next = await s.runCode('x')
  assert.equal(next.error, undefined)
  assert.equal(next.text, '41')

  // A pandas DataFrame: HTML and text.
  const df = await s.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["p", "q"]})')
  const r = df.results[0]
  assert.ok(r.isMainResult)
  assert.match(r.html, /<table/)
  assert.match(r.html, /<td>p<\/td>/)
  assert.match(r.text, /a\s+b/)

  // Other MIME types through IPython's display.
  const rich = await s.runCode(
    'from IPython.display import display, Markdown, Latex, JSON, SVG, Javascript\n' +
      'display(Markdown("# title"))\n' +
      'display(Latex(r"$x^2$"))\n' +
      'display(JSON({"k": [1, 2]}))\n' +
      'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>\'))\n' +
      'display(Javascript("console.log(1)"))',
  )
  const by = (f) => rich.results.find((x) => x[f] !== undefined)
  assert.equal(by('markdown').markdown, '# title')
  assert.equal(by('latex').latex, '$x^2$')
  assert.deepEqual(by('json').json, { k: [1, 2] })
  assert.match(by('svg').svg, /<svg/)
  assert.equal(by('javascript').javascript, 'console.log(1)')
  assert.ok(rich.results.every((x) => !x.isMainResult))
})

test('code interpreter: matplotlib returns a PNG and a chart', async (t) => {
  const s = await create(t)
  const line = await s.runCode(
    'import matplotlib.pyplot as plt\n' +
      'plt.plot([1, 2, 3], [4, 5, 6], label="up")\n' +
      'plt.title("T")\nplt.xlabel("X")\nplt.ylabel("Y")\nplt.show()',
  )
  assert.equal(line.error, undefined, JSON.stringify(line.error))
  const png = line.results.find((x) => x.png)
  assert.ok(png, `want a PNG result, got formats ${line.results.map((x) => x.formats())}`)
  const bytes = Buffer.from(png.png, 'base64')
  assert.deepEqual([...bytes.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47])
  assert.equal(png.chart.type, 'line')
  assert.equal(png.chart.title, 'T')
  assert.equal(png.chart.x_label, 'X')
  assert.deepEqual(png.chart.elements, [{ label: 'up', points: [[1, 4], [2, 5], [3, 6]] }])

  const bar = await s.runCode(
    'plt.figure()\nplt.bar(["a", "b"], [3, 7], label="g")\nplt.show()',
  )
  const bc = bar.results.find((x) => x.chart)?.chart
  assert.equal(bc?.type, 'bar', JSON.stringify(bar.results.map((x) => x.formats())))
  assert.deepEqual(bc.elements, [
    { label: 'a', group: 'g', value: 3 },
    { label: 'b', group: 'g', value: 7 },
  ])

  const pie = await s.runCode('plt.figure()\nplt.pie([1, 3], labels=["s", "l"])\nplt.show()')
  const pc = pie.results.find((x) => x.chart)?.chart
  assert.equal(pc?.type, 'pie')
  assert.deepEqual(pc.elements.map((e) => [e.label, Math.round(e.angle)]), [['s', 90], ['l', 270]])

  const sc = await s.runCode('plt.figure()\nplt.scatter([1, 2], [3, 4])\nplt.show()')
  const scc = sc.results.find((x) => x.chart)?.chart
  assert.equal(scc?.type, 'scatter')
  assert.deepEqual(scc.elements[0].points, [[1, 3], [2, 4]])
})

test('code interpreter: contexts have their own state and cwd; restart; remove', async (t) => {
  const s = await create(t)
  const c1 = await s.createCodeContext({ cwd: '/tmp' })
  assert.equal(c1.cwd, '/tmp')
  assert.equal(c1.language, 'python')
  const c2 = await s.createCodeContext()
  assert.equal(c2.cwd, '/home/user')

  await s.runCode('v = "one"', { context: c1 })
  await s.runCode('v = "two"', { context: c2 })
  assert.equal((await s.runCode('v', { context: c1 })).text, "'one'")
  assert.equal((await s.runCode('v', { context: c2 })).text, "'two'")
  const d = await s.runCode('v', {})
  assert.equal(d.error?.name, 'NameError', 'the default context does not see other contexts')
  assert.equal((await s.runCode('import os; os.getcwd()', { context: c1 })).text, "'/tmp'")
  assert.equal((await s.runCode('import os; os.getcwd()', { context: c2 })).text, "'/home/user'")

  const ids = (await s.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(c1.id) && ids.includes(c2.id), `list ${ids}`)

  await s.restartCodeContext(c1)
  assert.equal((await s.runCode('v', { context: c1 })).error?.name, 'NameError', 'restart clears state')
  assert.equal((await s.runCode('v', { context: c2 })).text, "'two'", 'restart touches only its context')

  await s.removeCodeContext(c2.id)
  assert.ok(!(await s.listCodeContexts()).some((c) => c.id === c2.id))
  await assert.rejects(s.runCode('v', { context: c2 }), (e) => e.name === 'NotFoundError')

  await assert.rejects(s.createCodeContext({ cwd: '/no/such/dir' }), (e) => e.name === 'SandboxError')
  await assert.rejects(s.runCode('1', { language: 'cobol' }), (e) => e.name === 'SandboxError')
})

test('code interpreter: envs per execution, sandbox envs, timeout keeps the kernel', async (t) => {
  const s = await create(t, { envs: { SANDBOX_ENV: 'from-create' } })
  const e = await s.runCode('import os; os.environ.get("PER_RUN")', { envs: { PER_RUN: 'yes' } })
  assert.equal(e.text, "'yes'")
  assert.equal((await s.runCode('str(os.environ.get("PER_RUN"))')).text, "'None'", 'envs last one execution')
  assert.equal((await s.runCode('os.environ.get("SANDBOX_ENV")')).text, "'from-create'")

  await s.runCode('kept = 5')
  const t0 = Date.now()
  await assert.rejects(
    s.runCode('import time\nspins = 0\nwhile True:\n    spins += 1\n    time.sleep(0.01)', { timeoutMs: 2_000 }),
    (err) => err.name === 'TimeoutError',
  )
  t.diagnostic(`timeout returned after ${Date.now() - t0} ms`)
  // The execution was interrupted, not left running: the loop never ends
  // by itself, so a later execution in the same kernel gets its turn only
  // if the interrupt stopped it. The state is still there.
  const t1 = Date.now()
  const after = await s.runCode('kept, spins > 0, type(__import__("sys").last_value).__name__', { timeoutMs: 30_000 })
  t.diagnostic(`next runCode after the timeout: ${Date.now() - t1} ms`)
  assert.equal(after.text, "(5, True, 'KeyboardInterrupt')")
  const spins = Number((await s.runCode('spins')).text)
  const again = Number((await s.runCode('spins')).text)
  assert.equal(again, spins, 'the loop is not running any more')
})

test('code interpreter: two sandboxes do not share state; the network is fenced', async (t) => {
  const [a, b] = await Promise.all([create(t), create(t)])
  await a.runCode('secret = "only-in-a"')
  const r = await b.runCode('secret')
  assert.equal(r.error?.name, 'NameError')
  assert.equal((await a.runCode('secret')).text, "'only-in-a'")

  // Default-deny egress applies to the kernel like to any process.
  const net = await a.runCode(
    'import urllib.request\n' +
      'try:\n' +
      '    urllib.request.urlopen("http://example.com", timeout=5)\n' +
      '    print("reached")\n' +
      'except Exception as e:\n' +
      '    print("blocked", type(e).__name__)',
  )
  assert.match(net.logs.stdout.join(''), /^blocked/, net.logs.stdout.join(''))
})
