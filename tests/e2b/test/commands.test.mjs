// commands.*: foreground and background runs, output callbacks, env, cwd,
// users, timeouts, kill, list, connect, stdin, exit errors.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError, Sandbox } from 'e2b'
import { create, opts, sleep, waitFor, within } from '../helpers.mjs'

test('run in the foreground returns stdout, stderr and the exit code', async (t) => {
  const s = await create(t)
  const r = await s.commands.run('echo hi; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hi\n')
  assert.equal(r.stderr, 'oops\n')
})

test('onStdout and onStderr receive the output as it comes', async (t) => {
  const s = await create(t)
  const out = []
  const err = []
  const r = await s.commands.run('for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done', {
    onStdout: (d) => out.push(d),
    onStderr: (d) => err.push(d),
  })
  assert.equal(out.join(''), 'out1\nout2\nout3\n')
  assert.equal(err.join(''), 'err1\nerr2\nerr3\n')
  assert.ok(out.length >= 2, `stdout came in ${out.length} chunk(s), want it streamed`)
  assert.equal(r.stdout, 'out1\nout2\nout3\n')
})

test('non-zero exit throws CommandExitError', async (t) => {
  const s = await create(t)
  await assert.rejects(s.commands.run('echo partial; echo bad >&2; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError, `got ${e?.name}: ${e?.message}`)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'partial\n')
    assert.equal(e.stderr, 'bad\n')
    return true
  })
  const h = await s.commands.run('exit 5', { background: true })
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === 5)
})

test('envs: global from create, per command, and not leaking', async (t) => {
  const s = await create(t, { envs: { GLOBAL_VAR: 'g', OVERRIDDEN: 'global' } })
  const r = await s.commands.run('echo "$GLOBAL_VAR $LOCAL_VAR $OVERRIDDEN"', {
    envs: { LOCAL_VAR: 'l', OVERRIDDEN: 'local' },
  })
  assert.equal(r.stdout, 'g l local\n')
  const r2 = await s.commands.run('echo "[$LOCAL_VAR] $OVERRIDDEN"')
  assert.equal(r2.stdout, '[] global\n')
})

test('default user is "user" in /home/user; user root and cwd are honoured', async (t) => {
  const s = await create(t)
  const who = await s.commands.run('whoami; pwd; echo $HOME')
  assert.equal(who.stdout, 'user\n/home/user\n/home/user\n')
  const root = await s.commands.run('whoami; pwd; echo $HOME', { user: 'root' })
  assert.equal(root.stdout, 'root\n/root\n/root\n')
  const cwd = await s.commands.run('pwd', { cwd: '/tmp' })
  assert.equal(cwd.stdout, '/tmp\n')
  const rel = await s.commands.run('mkdir -p sub && cd sub && pwd')
  assert.equal(rel.stdout, '/home/user/sub\n')
  const cwdRel = await s.commands.run('pwd', { cwd: 'sub' })
  assert.equal(cwdRel.stdout, '/home/user/sub\n')
  await assert.rejects(s.commands.run('pwd', { cwd: '/does/not/exist' }), (e) => {
    assert.ok(!(e instanceof CommandExitError), 'a bad cwd is a start error, not an exit')
    return true
  })
})

test('sudo from the default user', async (t) => {
  const s = await create(t)
  assert.equal((await s.commands.run('sudo -n whoami')).stdout, 'root\n')
  // As on E2B, per-command envs do not reach sudo's command.
  const r = await s.commands.run('sudo echo "[$FOO]" && sudo sh -c \'echo "[$FOO]"\'', { envs: { FOO: 'bar' } })
  assert.equal(r.stdout, '[bar]\n[]\n')
})

test('timeoutMs kills a command that runs too long', async (t) => {
  const s = await create(t)
  const start = Date.now()
  await assert.rejects(s.commands.run('sleep 30', { timeoutMs: 1_500 }), (e) => {
    assert.equal(e.name, 'TimeoutError', `${e.name}: ${e.message}`)
    return true
  })
  assert.ok(Date.now() - start < 20_000)
  // The process is gone, not just the stream.
  await waitFor(async () => {
    const list = await s.commands.list()
    return !list.some((p) => p.args.join(' ').includes('sleep 30'))
  }, 5_000)
})

test('background: list, connect, kill', async (t) => {
  const s = await create(t)
  const h = await s.commands.run('echo started; sleep 60', { background: true })
  assert.ok(h.pid > 0)
  const h2 = await s.commands.run('sleep 61', { background: true })

  const list = await s.commands.list()
  const pids = list.map((p) => p.pid)
  assert.ok(pids.includes(h.pid) && pids.includes(h2.pid), `list = ${JSON.stringify(list)}`)
  const p = list.find((p) => p.pid === h.pid)
  assert.equal(p.cmd, '/bin/bash')
  assert.deepEqual(p.args, ['-l', '-c', 'echo started; sleep 60'])

  // Connect to a running command and see its output and end.
  const seen = []
  const c = await s.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
  assert.equal(c.pid, h.pid)

  assert.equal(await s.commands.kill(h.pid), true)
  await assert.rejects(c.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, `${e?.name}: ${e?.message}`)
    assert.notEqual(e.exitCode, 0)
    return true
  })
  await assert.rejects(h.wait(), CommandExitError)
  assert.equal(await s.commands.kill(h.pid), false, 'kill of a finished command')
  assert.equal(await h2.kill(), true)
  assert.equal(await s.commands.kill(999999), false, 'kill of an unknown pid')
  await assert.rejects(s.commands.connect(999999))
})

test('background command keeps running after disconnect', async (t) => {
  const s = await create(t)
  const h = await s.commands.run('sleep 1; echo done > /tmp/bg-done', { background: true })
  await h.disconnect()
  await waitFor(async () => s.files.exists('/tmp/bg-done'), 10_000, 200)
})

test('sendStdin and closeStdin', async (t) => {
  const s = await create(t)
  const out = []
  const h = await s.commands.run('cat', { background: true, stdin: true, onStdout: (d) => out.push(d) })
  await h.sendStdin('hello ')
  await s.commands.sendStdin(h.pid, new TextEncoder().encode('world\n'))
  await waitFor(() => out.join('') === 'hello world\n', 5_000, 50)
  await h.closeStdin()
  const r = await within(h.wait(), 10_000, 'cat after closeStdin')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello world\n')
})

test('stdin is not open unless asked for: cat ends at once', async (t) => {
  const s = await create(t)
  const r = await within(s.commands.run('cat; echo eof'), 10_000, 'cat without stdin')
  assert.equal(r.stdout, 'eof\n')
})

test('large output arrives whole', async (t) => {
  const s = await create(t)
  const r = await s.commands.run('head -c 3000000 /dev/zero | tr "\\0" a')
  assert.equal(r.stdout.length, 3_000_000)
})

test('killing the sandbox during a run rejects with the SDK error', async (t) => {
  const s = await create(t)
  const h = await s.commands.run('sleep 60', { background: true })
  const fg = s.commands.run('sleep 60')
  fg.catch(() => {}) // examined below
  await sleep(500)
  assert.equal(await Sandbox.kill(s.sandboxId, opts), true)
  const results = await within(Promise.allSettled([h.wait(), fg]), 15_000, 'commands of a killed sandbox')
  for (const r of results) {
    assert.equal(r.status, 'rejected')
    assert.equal(r.reason.name, 'TimeoutError', `${r.reason.name}: ${r.reason.message}`)
    assert.match(r.reason.message, /killed or reached its end of life/)
  }
})

test('template "minimal" (busybox, no bash) runs commands through /bin/sh', async (t) => {
  const s = await create(t, { template: 'minimal' })
  const r = await s.commands.run('echo hi from $(basename $(readlink -f /proc/$$/exe))')
  assert.equal(r.stdout, 'hi from busybox\n')
  await s.files.write('/tmp/m.txt', 'minimal')
  assert.equal(await s.files.read('/tmp/m.txt'), 'minimal')
})
