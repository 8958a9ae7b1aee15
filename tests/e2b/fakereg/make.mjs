// Builds the fake registries' content for the template tests: a small
// pure-Python wheel behind a PEP 503 simple index, and a .deb (made with
// dpkg-deb) in a flat apt repository with Packages and Release files.
import { mkdirSync, writeFileSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { createHash } from 'node:crypto'
import { execFileSync } from 'node:child_process'

const sha256 = (b, enc = 'hex') => createHash('sha256').update(b).digest(enc)

const crcTable = Array.from({ length: 256 }, (_, n) => {
  let c = n
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
  return c >>> 0
})
function crc32(buf) {
  let c = 0xffffffff
  for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8)
  return (c ^ 0xffffffff) >>> 0
}

// zip writes an uncompressed (stored) zip archive of files.
function zip(files) {
  const parts = []
  const central = []
  let off = 0
  for (const f of files) {
    const name = Buffer.from(f.name)
    const data = Buffer.from(f.data)
    const crc = crc32(data)
    const h = Buffer.alloc(30)
    h.writeUInt32LE(0x04034b50, 0); h.writeUInt16LE(20, 4); h.writeUInt16LE(0x21, 12)
    h.writeUInt32LE(crc, 14); h.writeUInt32LE(data.length, 18); h.writeUInt32LE(data.length, 22)
    h.writeUInt16LE(name.length, 26)
    parts.push(h, name, data)
    const c = Buffer.alloc(46)
    c.writeUInt32LE(0x02014b50, 0); c.writeUInt16LE(20, 4); c.writeUInt16LE(20, 6); c.writeUInt16LE(0x21, 14)
    c.writeUInt32LE(crc, 16); c.writeUInt32LE(data.length, 20); c.writeUInt32LE(data.length, 24)
    c.writeUInt16LE(name.length, 28); c.writeUInt32LE((0o100644 << 16) >>> 0, 38); c.writeUInt32LE(off, 42)
    central.push(c, name)
    off += 30 + name.length + data.length
  }
  const cd = Buffer.concat(central)
  const e = Buffer.alloc(22)
  e.writeUInt32LE(0x06054b50, 0); e.writeUInt16LE(files.length, 8); e.writeUInt16LE(files.length, 10)
  e.writeUInt32LE(cd.length, 12); e.writeUInt32LE(off, 16)
  return Buffer.concat([...parts, cd, e])
}

// makeRegistries fills dir and returns what the test checks for.
export function makeRegistries(dir) {
  // The wheel: fencehello 1.0, py3-none-any.
  const files = [
    { name: 'fencehello/__init__.py', data: 'def greet():\n    return "hello from the fake index"\n' },
    { name: 'fencehello-1.0.dist-info/METADATA', data: 'Metadata-Version: 2.1\nName: fencehello\nVersion: 1.0\nSummary: fence test package\n' },
    { name: 'fencehello-1.0.dist-info/WHEEL', data: 'Wheel-Version: 1.0\nGenerator: fence-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n' },
  ]
  const record = files.map((f) => `${f.name},sha256=${sha256(Buffer.from(f.data), 'base64url')},${Buffer.byteLength(f.data)}`)
  record.push('fencehello-1.0.dist-info/RECORD,,')
  files.push({ name: 'fencehello-1.0.dist-info/RECORD', data: record.join('\n') + '\n' })
  const whl = zip(files)
  const whlName = 'fencehello-1.0-py3-none-any.whl'
  mkdirSync(join(dir, 'packages'), { recursive: true })
  writeFileSync(join(dir, 'packages', whlName), whl)
  mkdirSync(join(dir, 'simple', 'fencehello'), { recursive: true })
  writeFileSync(join(dir, 'simple', 'index.html'), '<!DOCTYPE html><html><body><a href="fencehello/">fencehello</a></body></html>\n')
  writeFileSync(join(dir, 'simple', 'fencehello', 'index.html'),
    `<!DOCTYPE html><html><body><a href="../../packages/${whlName}#sha256=${sha256(whl)}">${whlName}</a></body></html>\n`)

  // The .deb: fence-hello 1.0, all, one script.
  const pkg = join(dir, 'debroot')
  mkdirSync(join(pkg, 'DEBIAN'), { recursive: true })
  mkdirSync(join(pkg, 'usr', 'bin'), { recursive: true })
  const control = 'Package: fence-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: fence tests <tests@fence.invalid>\nDescription: fence test package\n'
  writeFileSync(join(pkg, 'DEBIAN', 'control'), control)
  writeFileSync(join(pkg, 'usr', 'bin', 'fence-hello'), '#!/bin/sh\necho "hello from the fake apt repository"\n', { mode: 0o755 })
  mkdirSync(join(dir, 'apt'), { recursive: true })
  const debName = 'fence-hello_1.0_all.deb'
  execFileSync('dpkg-deb', ['--root-owner-group', '-Zgzip', '--build', pkg, join(dir, 'apt', debName)], { stdio: 'pipe' })
  const deb = readFileSync(join(dir, 'apt', debName))
  const md5 = (b) => createHash('md5').update(b).digest('hex')
  const packages = control + `Filename: ./${debName}\nSize: ${deb.length}\nMD5sum: ${md5(deb)}\nSHA256: ${sha256(deb)}\n\n`
  writeFileSync(join(dir, 'apt', 'Packages'), packages)
  const date = new Date(Date.now() - 60_000).toUTCString().replace('GMT', 'UTC')
  const release = `Origin: fence-test\nLabel: fence-test\nDate: ${date}\nMD5Sum:\n ${md5(packages)} ${packages.length} Packages\nSHA256:\n ${sha256(packages)} ${packages.length} Packages\n`
  writeFileSync(join(dir, 'apt', 'Release'), release)
  statSync(join(dir, 'apt', 'Release'))
  return { wheel: whlName, deb: debName }
}
