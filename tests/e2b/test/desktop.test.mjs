// The unmodified @e2b/desktop SDK against fence's desktop template: its
// default template name, the mouse, keyboard and screenshots on a real X
// desktop, the noVNC stream through the daemon's port proxy (viewed by
// headless Chromium on the host), the desktop's browser behind the egress
// allowlist, and a desktop call on a sandbox of another template.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import net from 'node:net'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { Sandbox as Desktop } from '@e2b/desktop'
import { CommandExitError, TimeoutError } from 'e2b'
import { create, opts, waitFor, within } from '../helpers.mjs'
import { count, decodePNG, distinct, pixel } from '../png.mjs'
import { browser } from '../cdp.mjs'
import { serveInRegistryNS } from '../fakereg/serve.mjs'

// desktop creates a sandbox with the SDK's own create (the default
// template name, "desktop") and kills it at the end of the test. The
// template missing skips the test, or fails it under CI.
async function desktop(t, extra = {}) {
  let d
  try {
    d = await Desktop.create({ ...opts, timeoutMs: 300_000, ...extra })
  } catch (e) {
    if (/template "desktop" is not built|not found/i.test(String(e.message)) && !process.env.CI) {
      t.skip('the desktop template is not built (fence template build desktop)')
      return null
    }
    throw e
  }
  t.after(() => d.kill().catch(() => {}))
  return d
}

const isRed = ([r, g, b]) => r > 200 && g < 60 && b < 60
const isGreen = ([r, g, b]) => g > 200 && r < 60 && b < 60

test('mouse, keyboard and screenshots on the desktop, at the requested resolution', async (t) => {
  const d = await desktop(t, { resolution: [800, 600], dpi: 120 })
  if (!d) return
  assert.deepEqual(await d.getScreenSize(), { width: 800, height: 600 })
  const dpi = await d.commands.run('xdpyinfo | grep resolution')
  assert.match(dpi.stdout, /120x120 dots per inch/)

  // XFCE draws its desktop's background a moment after its processes
  // start (seconds later on gvisor): wait for it, so that the pixels
  // compared below outside the window are the settled desktop's.
  await waitFor(async () => pixel(decodePNG(await d.screenshot()), 760, 560).some((v) => v > 0), 60_000, 500)
  const before = decodePNG(await d.screenshot())
  assert.equal(before.width, 800)
  assert.equal(before.height, 600)
  assert.equal(count(before, 100, 100, 200, 100, isRed), 0, 'nothing red where the window will be')

  // A red xterm at a known place, which the window manager maps and
  // focuses; click into it and type a command.
  await d.commands.run("xterm -bg '#ff0000' -fg '#ffffff' -geometry 40x12+60+60", { background: true, timeoutMs: 0 })
  const shot = await waitFor(async () => {
    const img = decodePNG(await d.screenshot())
    return count(img, 100, 100, 200, 100, isRed) > 10_000 ? img : null
  }, 60_000, 500)

  await d.leftClick(200, 150)
  assert.deepEqual(await d.getCursorPosition(), { x: 200, y: 150 })
  await d.write('echo typed-into-xterm > /tmp/typed')
  await d.press('enter')
  const typed = await waitFor(async () => {
    const r = await d.commands.run('cat /tmp/typed 2>/dev/null || true')
    return r.stdout.trim() || null
  }, 30_000, 300)
  assert.equal(typed, 'typed-into-xterm')
  // The typed line is drawn in the window's top rows; outside the
  // window, nothing changed.
  const after = decodePNG(await d.screenshot())
  assert.deepEqual(pixel(after, 760, 560), pixel(shot, 760, 560))
  assert.notEqual(count(after, 62, 62, 280, 60, (p) => !isRed(p)), count(shot, 62, 62, 280, 60, (p) => !isRed(p)), 'the typed line changed the window')

  // The rest of the mouse and keyboard API, each checked by where the
  // pointer ends or by what the SDK returns.
  await d.moveMouse(300, 200)
  assert.deepEqual(await d.getCursorPosition(), { x: 300, y: 200 })
  await d.doubleClick(120, 80)
  await d.middleClick(130, 90)
  await d.rightClick(140, 100)
  await d.press('esc')
  await d.scroll('up', 3)
  await d.scroll('down', 2)
  await d.drag([400, 400], [500, 450])
  assert.deepEqual(await d.getCursorPosition(), { x: 500, y: 450 })
  await d.press(['ctrl', 'l'])
  await d.wait(200)
  const ids = await waitFor(async () => {
    const w = await windows(d, 'xterm')
    return w.length >= 1 && w[0] !== '' ? w : null
  }, 30_000, 300)
  assert.match(await d.getWindowTitle(ids[0]), /\S/)

  // launch() runs a desktop entry by gtk-launch.
  await d.launch('xterm')
  await waitFor(async () => (await windows(d, 'xterm')).length >= 2, 60_000, 500)
})

// windows is the SDK's getApplicationWindows, with no window for an exit
// of 1: xdotool's search exits 1 when nothing matches, and also when a
// window it looks at is destroyed while it looks (Xlib's default handler
// of BadWindow), as windows come and go on a desktop whose apps start.
// Polls retry those; every other failure is the test's.
async function windows(d, app) {
  try {
    return await d.getApplicationWindows(app)
  } catch (e) {
    if (e instanceof CommandExitError && e.exitCode === 1) return []
    throw e
  }
}

// proxyTo serves, on a loopback port, the daemon's port proxy for host
// (every request and WebSocket upgrade re-sent with Host: host), since a
// browser cannot set Host itself. It returns the port.
async function proxyTo(t, host) {
  const api = new URL(process.env.E2B_API_URL)
  const srv = http.createServer((req, res) => {
    const up = http.request({ host: api.hostname, port: api.port, path: req.url, method: req.method, headers: { ...req.headers, host } }, (r) => {
      res.writeHead(r.statusCode, r.headers)
      r.pipe(res)
    })
    up.on('error', () => res.destroy())
    req.pipe(up)
  })
  srv.on('upgrade', (req, sock, head) => {
    const up = net.connect(Number(api.port), api.hostname, () => {
      const lines = [`${req.method} ${req.url} HTTP/1.1`]
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i].toLowerCase() === 'host' ? host : req.rawHeaders[i + 1]}`)
      }
      up.write(lines.join('\r\n') + '\r\n\r\n')
      up.write(head)
      up.pipe(sock)
      sock.pipe(up)
    })
    up.on('error', () => sock.destroy())
    sock.on('error', () => up.destroy())
  })
  await new Promise((r) => srv.listen(0, '127.0.0.1', r))
  t.after(() => {
    srv.closeAllConnections()
    srv.close()
  })
  return srv.address().port
}

// refused reports whether nothing accepts connections on the host at port.
function refused(port) {
  return new Promise((resolve) => {
    const c = net.connect(port, '127.0.0.1')
    c.on('connect', () => { c.destroy(); resolve(false) })
    c.on('error', () => resolve(true))
  })
}

test('the stream: noVNC through the port proxy shows the desktop with the auth key, not with a wrong one', async (t) => {
  const d = await desktop(t, { resolution: [1024, 768] })
  if (!d) return
  await d.commands.run("xterm -bg '#00ff00' -geometry 60x20+100+100", { background: true, timeoutMs: 0 })
  await d.stream.start({ requireAuth: true })
  const key = d.stream.getAuthKey()
  const url = new URL(d.stream.getUrl({ authKey: key }))
  assert.equal(url.host, `6080-${d.sandboxId}.localhost`)
  assert.equal(url.pathname, '/vnc.html')
  assert.equal(url.searchParams.get('password'), key)
  assert.equal(url.searchParams.get('autoconnect'), 'true')
  // The stream is served by the sandbox through the daemon only.
  assert.ok(await refused(6080), 'nothing listens on the host at 6080')
  assert.ok(await refused(5900), 'nothing listens on the host at 5900')

  const port = await proxyTo(t, url.host)
  const b = await browser(t)
  const view = `http://127.0.0.1:${port}${url.pathname}${url.search}`
  const ok = await b.open(view)
  await waitFor(() => ok.probe("document.documentElement.classList.contains('noVNC_connected')"), 60_000, 500).catch(async (e) => {
    const status = await ok.probe("(document.getElementById('noVNC_status')?.textContent ?? '') + ' | ' + document.title + ' | ' + document.documentElement.className + ' | ' + performance.getEntriesByType('resource').map((r) => r.name.replace(/^.*\\//, '') + ':' + Math.round(r.duration)).join(' ')")
    const log = await d.commands.run('cat /tmp/novnc.log /tmp/x11vnc_stderr.log').catch((x) => x)
    throw new Error(`${e.message}: noVNC says ${JSON.stringify(status)}; logs:\n${log.stdout}`)
  })
  // The canvas is drawn: the green window is in it, scaled into the page.
  const drawn = await waitFor(async () => {
    const img = decodePNG(await ok.screenshot())
    return count(img, 0, 0, img.width, img.height, isGreen) > 5_000 ? img : null
  }, 60_000, 500)
  assert.ok(distinct(drawn) > 10, 'the screenshot of the stream is not blank')

  // A wrong key: the VNC server rejects it and nothing is drawn.
  url.searchParams.set('password', 'not-the-key')
  const bad = await b.open(`http://127.0.0.1:${port}${url.pathname}${url.search}`)
  const status = await waitFor(async () => {
    const s = await bad.probe("(document.getElementById('noVNC_status')?.textContent ?? '')")
    return /fail|reject/i.test(s ?? '') ? s : null
  }, 60_000, 500)
  // x11vnc's answer, relayed by noVNC: "New connection has been rejected
  // with reason: password check failed!"
  assert.match(status, /password check failed/)
  assert.equal(await bad.eval("document.documentElement.classList.contains('noVNC_connected')"), false)
  const badImg = decodePNG(await bad.screenshot())
  assert.equal(count(badImg, 0, 0, badImg.width, badImg.height, isGreen), 0, 'the desktop is not shown')

  // stop() ends x11vnc and noVNC: the port proxy then has nothing to reach
  // (502, as for any closed port).
  await d.stream.stop()
  let last
  await waitFor(async () => {
    const r = await fetch(`http://127.0.0.1:${port}/vnc.html`, { signal: AbortSignal.timeout(10_000) }).catch((e) => e)
    last = r.status ?? String(r)
    return r.status === 502
  }, 60_000, 500).catch((e) => { throw new Error(`${e.message}: the stream's URL after stop() answers ${last}`) })
  // The SDK's stop() sends x11vnc a SIGTERM; how soon x11vnc exits is its
  // own affair (with clients attached it can take longer than the test
  // waits, on a loaded machine). The stream is already unreachable (the
  // 502 above); so that the next test starts with no VNC server, one that
  // lingers is said and killed.
  const gone = async () => (await d.commands.run('pgrep -x x11vnc').catch((e) => e)) instanceof CommandExitError
  await waitFor(gone, 30_000, 300).catch(async () => {
    const ps = await d.commands.run('ps -eo pid,ppid,stat,args').catch((e) => e)
    t.diagnostic(`x11vnc still runs 30 s after stop(): ${ps.stdout}`)
    await d.commands.run('pkill -KILL -x x11vnc', { user: 'root' }).catch(() => {})
    await waitFor(gone, 30_000, 300)
  })
})

// fakeSite serves html as index.html from run.sh's registry namespace on
// port 8090 (REGISTRY_IP and DENIED_IP both answer there).
async function fakeSite(t, html) {
  return serveInRegistryNS(t, { port: 8090, what: 'the fake site', fill: (dir) => writeFileSync(join(dir, 'index.html'), html) })
}

test("the desktop's browser goes out through the egress allowlist", async (t) => {
  const site = await fakeSite(t, '<html><head><title>fence-desktop-page</title></head><body style="margin:0;background:#00ff00;height:100vh"></body></html>')
  if (!site) return
  const d = await desktop(t, { resolution: [1024, 768], network: { denyOut: ['0.0.0.0/0'], allowOut: [site.ip] } })
  if (!d) return
  // open() hands the URL to the desktop's browser: the allowed page is drawn.
  await d.open(`http://${site.ip}:8090/`)
  await waitFor(async () => {
    const img = decodePNG(await d.screenshot())
    return count(img, 0, 0, img.width, img.height, isGreen) > 100_000
  }, 120_000, 1000)
  assert.ok(site.requests.some((l) => l.includes(`REQ ${site.ip} GET / 200`)), site.requests.join('\n'))

  // One browser at a time: a gvisor sandbox's 512 MiB (the daemon's
  // default, gVisor's own memory included) holds the desktop and one
  // chromium, not two.
  await d.commands.run('pkill -x chromium; while pgrep -x chromium >/dev/null; do sleep 0.2; done', { timeoutMs: 30_000 })

  // The same browser is refused what the allowlist does not name: an
  // address (nothing reaches the server there) and a domain (it does not
  // resolve).
  const chrome = (u) => d.commands.run(`chromium --headless --user-data-dir=/tmp/ch-$$ --dump-dom ${u} 2>/tmp/chromium.err`, { timeoutMs: 120_000 }).catch((e) => e)
  const allowed = await chrome(`http://${site.ip}:8090/`)
  assert.match(allowed.stdout ?? '', /fence-desktop-page/, `${allowed}\n${(await d.commands.run('tail -20 /tmp/chromium.err')).stdout}`)
  const denied = await chrome(`http://${site.denied}:8090/`)
  assert.doesNotMatch(denied.stdout ?? '', /fence-desktop-page/)
  assert.ok(!site.requests.some((l) => l.includes(`REQ ${site.denied} `)), site.requests.join('\n'))
  const domain = await chrome('http://example.com/')
  assert.doesNotMatch(domain.stdout ?? '', /Example Domain/)
  const dns = await d.commands.run('getent hosts example.com').catch((e) => e)
  assert.notEqual(dns.exitCode, 0, 'a domain off the allowlist does not resolve')
})

test('a desktop call on a sandbox of another template fails with the SDK error', async (t) => {
  // create() of another template: the SDK's own Xvfb start fails and it
  // says so (and kills the sandbox).
  await assert.rejects(within(Desktop.create('base', { ...opts, timeoutMs: 120_000 }), 120_000, 'Desktop.create(base)'), (e) => {
    assert.ok(e instanceof TimeoutError, `TimeoutError, got ${e}`)
    assert.match(e.message, /Could not start Xvfb/)
    return true
  })
  // A base sandbox connected as a desktop: screenshot() is scrot not found.
  const s = await create(t)
  const d = await Desktop.connect(s.sandboxId, opts)
  await assert.rejects(within(d.screenshot(), 60_000, 'screenshot'), (e) => {
    assert.ok(e instanceof CommandExitError, `CommandExitError, got ${e}`)
    assert.match(e.stderr, /scrot/)
    return true
  })
})
