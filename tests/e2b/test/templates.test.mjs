// The official SDK's Template builder against fence: builds run fenced in
// sandboxes, are cached by E2B's chain key, and their templates start
// sandboxes with the build's default user, workdir and start command.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, mkdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { Sandbox, Template, BuildError, waitForURL, waitForFile } from 'e2b'
import { opts, create } from '../helpers.mjs'
import { makeRegistries } from '../fakereg/make.mjs'
import { serveInRegistryNS } from '../fakereg/serve.mjs'

const uniq = (p) => `${p}-${randomBytes(4).toString('hex')}`

function context(t) {
  const dir = mkdtempSync(join(tmpdir(), 'fence-tpl-'))
  t.after(() => rmSync(dir, { recursive: true, force: true }))
  writeFileSync(join(dir, 'hello.txt'), 'hello from the context\n')
  mkdirSync(join(dir, 'app'))
  writeFileSync(join(dir, 'app', 'main.py'), 'print("main")\n')
  writeFileSync(join(dir, 'app', 'index.html'), '<h1>fence template</h1>\n')
  return dir
}

// removeTemplate kills the sandboxes of a template, then deletes it (its
// layers go with it). Hooks registered with t.after run in order, so the
// sandboxes' own kill hooks would come only after this one.
async function removeTemplate(templateId, name) {
  const api = process.env.E2B_API_URL
  const headers = { 'X-API-Key': process.env.E2B_API_KEY }
  const list = await (await fetch(`${api}/v2/sandboxes?state=running,paused`, { headers })).json()
  for (const s of list) {
    const tpl = s.templateID.split(':')[0]
    if (tpl === name || tpl === templateId) {
      await fetch(`${api}/sandboxes/${s.sandboxID}`, { method: 'DELETE', headers })
    }
  }
  await fetch(`${api}/templates/${templateId}`, { method: 'DELETE', headers })
}

async function build(t, tpl, name, extra = {}) {
  const logs = []
  const info = await Template.build(tpl, name, { ...opts, onBuildLogs: (e) => logs.push(e.toString()), ...extra })
    .catch((err) => { err.message += `\nbuild log:\n${logs.join('\n')}`; throw err })
  t.after(() => removeTemplate(info.templateId, name.split(':')[0]).catch(() => {}))
  return { info, logs }
}

test('Template.build: copy, runCmd, setEnvs, setWorkdir, setUser, start and ready commands', async (t) => {
  const dir = context(t)
  const name = uniq('tpl-e2e')
  const tpl = () => Template({ fileContextPath: dir })
    .fromTemplate('base')
    .copy('hello.txt', '/opt/hello.txt')
    .copy('app', '/srv/app/')
    .setEnvs({ GREETING: 'build-time-only' })
    .runCmd('echo "$GREETING" > /tmp/greeting && sudo mv /tmp/greeting /opt/greeting')
    .setWorkdir('/srv/app')
    .runCmd('touch made-in-workdir')
    .setUser('root')
    .runCmd('echo root-was-here > /opt/root.txt')
    .setUser('user')
    .setStartCmd('python3 -m http.server 8000', waitForURL('http://localhost:8000/index.html'))
  const { info, logs } = await build(t, tpl(), name, { cpuCount: 1, memoryMB: 768 })
  assert.equal(info.name, name)
  assert.ok(logs.some((l) => l.includes('[builder')), 'step lines in the build logs')

  const s = await create(t, { template: name })
  const sinfo = await s.getInfo()
  assert.equal(sinfo.cpuCount, 1, 'the build\'s cpuCount sizes its sandboxes')
  assert.equal(sinfo.memoryMB, 768, 'the build\'s memoryMB sizes its sandboxes')
  const r = await s.commands.run('whoami && pwd && cat /opt/hello.txt /srv/app/main.py /opt/greeting /opt/root.txt && ls /srv/app && stat -c %U /opt/hello.txt && echo "env:${GREETING:-unset}"')
  const out = r.stdout
  assert.match(out, /^user\n\/srv\/app\n/, 'default user and workdir come from the build')
  assert.match(out, /hello from the context/)
  assert.match(out, /print\("main"\)/)
  assert.match(out, /build-time-only/)
  assert.match(out, /root-was-here/)
  assert.match(out, /made-in-workdir/)
  assert.match(out, /\nuser\n/, 'COPY gives the files to the context user')
  assert.match(out, /env:unset/, 'setEnvs is build-time only')
  // The start command runs at sandbox start; create answered once ready.
  const page = await s.commands.run('curl -s http://localhost:8000/index.html')
  assert.match(page.stdout, /fence template/)

  // An unchanged rebuild hits the cache at every step.
  const again = await build(t, tpl(), name)
  const cached = again.logs.filter((l) => l.includes('CACHED'))
  assert.ok(cached.length >= 8, `CACHED lines on an unchanged rebuild, got:\n${again.logs.join('\n')}`)
})

test('Template.build: a failing step fails the build with its log and exit code', async (t) => {
  const name = uniq('tpl-fail')
  t.after(() => removeTemplate(name, name).catch(() => {}))
  const tpl = Template().fromTemplate('base').runCmd('echo step-one').runCmd('echo about-to-fail; exit 7')
  const logs = []
  await assert.rejects(
    Template.build(tpl, name, { ...opts, onBuildLogs: (e) => logs.push(e.toString()) }),
    (err) => {
      assert.ok(err instanceof BuildError, `BuildError, got ${err}`)
      assert.match(err.message, /exit status 7/)
      assert.match(err.message, /about-to-fail; exit 7/)
      return true
    },
  )
  assert.ok(logs.some((l) => l.includes('about-to-fail')), 'the step output is in the logs')
  assert.equal(await Template.exists(name, opts), true, 'the template record exists')
  await assert.rejects(Sandbox.create(name, { ...opts }), /not found|404/i, 'no ready build, no sandbox')
})

test('Template.build: egress outside the allowlist is refused to a RUN step', async (t) => {
  const name = uniq('tpl-egress')
  t.after(() => removeTemplate(name, name).catch(() => {}))
  const tpl = Template().fromTemplate('base').runCmd('curl -sS --max-time 10 https://example.com -o /dev/null')
  await assert.rejects(Template.build(tpl, name, opts), (err) => err instanceof BuildError)
})

test('Template.exists, tags, buildInBackground and getBuildStatus', async (t) => {
  assert.equal(await Template.exists('base', opts), true)
  assert.equal(await Template.exists('minimal', opts), true)
  assert.equal(await Template.exists(uniq('never-built'), opts), false)

  const name = uniq('tpl-tags')
  const tpl = Template().fromTemplate('base').runCmd('echo v1 > /tmp/version')
  const bg = await Template.buildInBackground(tpl, `${name}:v1`, opts)
  t.after(() => removeTemplate(bg.templateId, name).catch(() => {}))
  const st = await Template.getBuildStatus(bg, opts)
  assert.ok(['building', 'ready'].includes(st.status), `status right after buildInBackground: ${st.status}`)
  let status = st
  for (let i = 0; i < 600 && status.status === 'building'; i++) {
    await new Promise((r) => setTimeout(r, 200))
    status = await Template.getBuildStatus(bg, opts)
  }
  assert.equal(status.status, 'ready', JSON.stringify(status.reason))
  assert.equal(await Template.exists(name, opts), true)

  // name:v1 alone has no default build.
  await assert.rejects(Sandbox.create(name, { ...opts }), /not found|404/i)
  const s = await create(t, { template: `${name}:v1` })
  assert.equal((await s.commands.run('cat /tmp/version')).stdout, 'v1\n')

  const assigned = await Template.assignTags(`${name}:v1`, ['prod', 'default'], opts)
  assert.equal(assigned.buildId, bg.buildId)
  const tags = (await Template.getTags(bg.templateId, opts)).map((x) => x.tag).sort()
  assert.deepEqual(tags, ['default', 'prod', 'v1'])
  const s2 = await create(t, { template: `${name}:prod` })
  assert.equal((await s2.commands.run('cat /tmp/version')).stdout, 'v1\n')
  // A template with live sandboxes cannot be deleted (E2B's 400).
  const del = await fetch(`${process.env.E2B_API_URL}/templates/${name}`, {
    method: 'DELETE', headers: { 'X-API-Key': process.env.E2B_API_KEY },
  })
  assert.equal(del.status, 400)
  assert.match((await del.json()).message, /running sandboxes/)
  await Template.removeTags(name, ['prod'], opts)
  assert.deepEqual((await Template.getTags(bg.templateId, opts)).map((x) => x.tag).sort(), ['default', 'v1'])
  await assert.rejects(Sandbox.create(`${name}:prod`, { ...opts }), /not found|404/i)
})

test('Template ready command: create waits for it', async (t) => {
  const name = uniq('tpl-ready')
  const tpl = Template().fromTemplate('base')
    .setStartCmd('sleep 2 && touch /tmp/ready-marker && sleep infinity', waitForFile('/tmp/ready-marker'))
  await build(t, tpl, name)
  const s = await create(t, { template: name })
  const r = await s.commands.run('ls /tmp/ready-marker')
  assert.equal(r.exitCode, 0)
})

test('Template().fromBaseImage() and the default base are fence\'s base template; skipCache runs every step', async (t) => {
  const name = uniq('tpl-baseimg')
  const cmd = 'python3 -c "print(6*7)" > /tmp/answer'
  await build(t, Template().fromBaseImage().runCmd(cmd), name)
  const s = await create(t, { template: name })
  assert.equal((await s.commands.run('cat /tmp/answer && whoami')).stdout, '42\nuser\n')
  const logs = []
  // skipCache forces every step after it.
  await Template.build(Template().fromBaseImage().skipCache().runCmd(cmd), name, { ...opts, onBuildLogs: (e) => logs.push(e.toString()) })
  assert.ok(!logs.some((l) => l.includes('CACHED [builder 1/')), `skipCache left a cached step:\n${logs.join('\n')}`)
})

// The fake registries of run.sh's registry namespace: a PEP 503 index and a
// flat apt repository, served from inside the namespace at REGISTRY_IP
// (admitted by the daemon's --build-allow and --pip-index-url) and
// DENIED_IP (on no allowlist).
async function fakeRegistries(t) {
  return serveInRegistryNS(t, { port: 8080, what: 'the fake registry server', fill: makeRegistries })
}

test('pipInstall and aptInstall from registries the build allowlist admits; a registry off it fails the step', async (t) => {
  const reg = await fakeRegistries(t)
  if (!reg) return
  const name = uniq('tpl-pkgs')
  const tpl = Template().fromTemplate('base')
    .pipInstall('fencehello') // the index of --pip-index-url
    .runCmd(`rm -f /etc/apt/sources.list.d/* && echo "deb [trusted=yes] http://${reg.ip}:8080/apt ./" > /etc/apt/sources.list`, { user: 'root' })
    .aptInstall('fence-hello', { noInstallRecommends: true })
  const { logs } = await build(t, tpl, name)
  assert.ok(reg.requests.some((l) => l.includes('/simple/fencehello/ 200')), `pip asked the index:\n${reg.requests.join('\n')}`)
  assert.ok(reg.requests.some((l) => l.includes('fence-hello_1.0_all.deb 200')), `apt fetched the .deb:\n${reg.requests.join('\n')}`)
  const s = await create(t, { template: name })
  const r = await s.commands.run('python3 -c "import fencehello; print(fencehello.greet())" && fence-hello')
  assert.equal(r.stdout, 'hello from the fake index\nhello from the fake apt repository\n', logs.join('\n'))

  // The same index at an address on no allowlist: the step fails, its
  // output in the log, and nothing reached the server there.
  const logs2 = []
  const deniedName = uniq('tpl-pkgs-denied')
  t.after(() => removeTemplate(deniedName, deniedName).catch(() => {}))
  const denied = Template().fromTemplate('base')
    .pipInstall(['--index-url', `http://${reg.denied}:8080/simple`, '--trusted-host', `${reg.denied}:8080`, '--retries', '0', '--timeout', '5', 'fencehello'])
  await assert.rejects(
    Template.build(denied, deniedName, { ...opts, onBuildLogs: (e) => logs2.push(e.toString()) }),
    (err) => {
      assert.ok(err instanceof BuildError, `BuildError, got ${err}`)
      assert.match(err.message, /pip install .*fencehello.*exit status/)
      return true
    },
  )
  assert.ok(logs2.some((l) => /No matching distribution found for fencehello|Could not find a version/.test(l)), `pip's error in the build log:\n${logs2.join('\n')}`)
  assert.ok(!reg.requests.some((l) => l.startsWith(`REQ ${reg.denied} `)), `a request reached the address off the allowlist:\n${reg.requests.join('\n')}`)
})

// On E2B a sandbox's templateId is its template's ID, whatever name the
// create used, and its name the alias; a sandbox made from a snapshot
// shows the snapshot's ID and name, a fork its source's. On gvisor a
// snapshot and a fork go on with the source's processes: the template's
// start command is not run again in them.
test('templateId and name of sandboxes from a built template, its snapshots and forks, on both backends', async (t) => {
  const name = uniq('tpl-id')
  const tpl = Template().fromTemplate('base').setStartCmd('date +%s%N > /tmp/started; sleep infinity', waitForFile('/tmp/started'))
  const { info } = await build(t, tpl, name)
  const listed = async (id) => (await (await fetch(`${process.env.E2B_API_URL}/v2/sandboxes`,
    { headers: { 'X-API-Key': process.env.E2B_API_KEY } })).json()).find((s) => s.sandboxID === id)
  const check = async (sbx, templateId, alias, what) => {
    const i = await sbx.getInfo()
    assert.equal(i.templateId, templateId, `${what}: templateId`)
    assert.equal(i.name, alias, `${what}: name`)
    const l = await listed(sbx.sandboxId)
    assert.equal(l.templateID, templateId, `${what}: listed templateID`)
    assert.equal(l.alias, alias, `${what}: listed alias`)
  }
  for (const backend of ['native', 'gvisor']) {
    const md = backend === 'gvisor' ? { metadata: { 'fence.backend': 'gvisor' } } : {}
    let a
    try {
      a = await create(t, { template: name, ...md })
    } catch (e) {
      if (backend === 'gvisor' && !process.env.CI && /not available/.test(String(e))) continue
      throw e
    }
    await check(a, info.templateId, name, `${backend}: by alias`)
    // (on gvisor, a later create restores the template's run image)
    await check(await create(t, { template: `${name}:default`, ...md }), info.templateId, name, `${backend}: by alias:tag`)
    await check(await create(t, { template: info.templateId, ...md }), info.templateId, name, `${backend}: by ID`)
    const listedByAlias = await Sandbox.list({ ...opts, query: { metadata: md.metadata } }).nextItems()
    assert.ok(listedByAlias.some((s) => s.sandboxId === a.sandboxId && s.templateId === info.templateId && s.name === name))

    const stamp = (await a.commands.run('cat /tmp/started')).stdout
    const snapName = uniq('snap-id')
    const snap = await a.createSnapshot({ ...opts, name: snapName })
    t.after(() => Sandbox.deleteSnapshot(snap.snapshotId, opts).catch(() => {}))
    const s = await create(t, { template: snap.snapshotId })
    const snapID = (await s.getInfo()).templateId
    assert.ok(snapID && snapID !== info.templateId && !snapID.includes(':'), `snapshot's sandbox templateId ${snapID}`)
    await check(s, snapID, snapName, `${backend}: from a named snapshot`)
    const [f] = await Sandbox.fork(a.sandboxId, { ...opts, count: 1, timeoutMs: 60_000 })
    t.after(() => f.kill().catch(() => {}))
    await check(f, info.templateId, name, `${backend}: fork`)
    const [fs] = await Sandbox.fork(s.sandboxId, { ...opts, count: 1, timeoutMs: 60_000 })
    t.after(() => fs.kill().catch(() => {}))
    await check(fs, snapID, snapName, `${backend}: fork of the snapshot's sandbox`)
    if (backend === 'gvisor') {
      for (const x of [s, f, fs]) {
        assert.equal((await x.commands.run('cat /tmp/started')).stdout, stamp, 'the start command ran again in a memory restore')
        assert.equal((await x.commands.run('ps -eo args | grep -c "^sleep infinity" || true')).stdout, '1\n')
      }
    }
  }
})
