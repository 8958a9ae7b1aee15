// pty.*: an interactive shell on a terminal: input, resize, kill.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { create, waitFor, within } from '../helpers.mjs'

const enc = new TextEncoder()

function collector() {
  const dec = new TextDecoder()
  const c = {
    text: '',
    onData: (d) => { c.text += dec.decode(d, { stream: true }) },
    // until waits for re in the output and shows the output if it never comes.
    until: (re) => waitFor(() => re.test(c.text), 10_000, 50).catch((e) => {
      throw new Error(`${e.message}: ${re} not in ${JSON.stringify(c.text)}`)
    }),
  }
  return c
}

test('pty: create, sendInput, resize, exit', async (t) => {
  const s = await create(t)
  const out = collector()
  const h = await s.pty.create({ cols: 80, rows: 24, onData: out.onData, timeoutMs: 60_000 })
  assert.ok(h.pid > 0)

  await s.pty.sendInput(h.pid, enc.encode('echo "size: $(stty size) cols: $(tput cols) tty: $(tty)"\n'))
  await out.until(/size: 24 80 cols: 80 tty: \/dev\/pts\/\d+/)

  await s.pty.resize(h.pid, { cols: 132, rows: 40 })
  await s.pty.sendInput(h.pid, enc.encode('echo "resized: $(stty size) $(tput cols)"\n'))
  await out.until(/resized: 40 132 132/)

  await s.pty.sendInput(h.pid, enc.encode('whoami; pwd; echo $TERM\n'))
  await out.until(/\ruser\r\n\/home\/user\r\nxterm-256color\r\n/)

  await s.pty.sendInput(h.pid, enc.encode('exit 0\n'))
  const r = await within(h.wait(), 10_000, 'pty after exit')
  assert.equal(r.exitCode, 0)
})

test('pty: user root, cwd and envs', async (t) => {
  const s = await create(t)
  const out = collector()
  const h = await s.pty.create({
    cols: 100, rows: 30, onData: out.onData, user: 'root', cwd: '/tmp', envs: { PTY_VAR: 'pty-val' },
  })
  await s.pty.sendInput(h.pid, enc.encode('echo "[$(whoami) $(pwd) $PTY_VAR]"\n'))
  await out.until(/\[root \/tmp pty-val\]/)
  assert.equal(await s.pty.kill(h.pid), true)
})

test('pty: kill ends the session', async (t) => {
  const s = await create(t)
  const out = collector()
  const h = await s.pty.create({ cols: 80, rows: 24, onData: out.onData })
  await s.pty.sendInput(h.pid, enc.encode('sleep 100\n'))
  assert.equal(await s.pty.kill(h.pid), true)
  await assert.rejects(within(h.wait(), 10_000, 'killed pty'), (e) => {
    assert.equal(e.name, 'CommandExitError', `${e.name}: ${e.message}`)
    return true
  })
  assert.equal(await s.pty.kill(h.pid), false)
})

test('pty: Ctrl-D ends the shell', async (t) => {
  const s = await create(t)
  const out = collector()
  const h = await s.pty.create({ cols: 80, rows: 24, onData: out.onData })
  // Wait for the prompt: bash discards typeahead while it sets up readline.
  await out.until(/\$ $/)
  await s.pty.sendInput(h.pid, new Uint8Array([4]))
  const r = await within(h.wait(), 10_000, 'pty after Ctrl-D')
  assert.equal(r.exitCode, 0)
})
