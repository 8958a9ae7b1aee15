import { Sandbox } from 'e2b'
const s = await Sandbox.create('base')
let text = ''
const dec = new TextDecoder()
const h = await s.pty.create({ cols: 80, rows: 24, onData: (d) => { text += dec.decode(d, { stream: true }) } })
await s.pty.sendInput(h.pid, new Uint8Array([4]))
try { console.log(await h.wait()) } catch (e) { console.log('wait err', e.message) }
console.log(JSON.stringify(text))
console.log(await s.isRunning())
await s.kill()
