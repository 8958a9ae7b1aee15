// A static file server for the template tests' fake package registries
// (a PEP 503 index and a flat apt repository). run.sh's registry network
// namespace runs it: `node server.mjs DIR PORT`. It serves DIR (a
// directory path serves its index.html), prints "listening" once ready
// and one line "REQ <local address> <method> <path> <status>" per request,
// the oracle of which address a build step reached.
import { createServer } from 'node:http'
import { readFileSync, statSync } from 'node:fs'
import { join, normalize } from 'node:path'

const [dir, port] = process.argv.slice(2)
const srv = createServer((req, res) => {
  let p = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname))
  if (p.includes('..')) p = '/'
  let f = join(dir, p)
  let status = 404
  try {
    if (statSync(f).isDirectory()) f = join(f, 'index.html')
    const body = readFileSync(f)
    status = 200
    res.writeHead(200, { 'Content-Length': body.length, 'Content-Type': f.endsWith('.html') ? 'text/html' : 'application/octet-stream' })
    res.end(req.method === 'HEAD' ? undefined : body)
  } catch {
    res.writeHead(404, { 'Content-Length': 0 })
    res.end()
  }
  console.log(`REQ ${req.socket.localAddress} ${req.method} ${req.url} ${status}`)
})
srv.listen(Number(port), '0.0.0.0', () => console.log('listening'))
