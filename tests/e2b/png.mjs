// A small PNG decoder for the desktop tests: 8-bit truecolour (RGB or
// RGBA) or greyscale, not interlaced (what scrot and Chromium write).
// decodePNG(buf) returns {width, height, channels, data}, data being the
// unfiltered rows; pixel(img, x, y) returns [r, g, b].
import { inflateSync } from 'node:zlib'

export function decodePNG(buf) {
  buf = Buffer.from(buf)
  if (buf.readUInt32BE(0) !== 0x89504e47) throw new Error('not a PNG')
  let off = 8
  let width, height, depth, type, interlace
  const idat = []
  while (off < buf.length) {
    const len = buf.readUInt32BE(off)
    const kind = buf.toString('latin1', off + 4, off + 8)
    const body = buf.subarray(off + 8, off + 8 + len)
    if (kind === 'IHDR') {
      width = body.readUInt32BE(0)
      height = body.readUInt32BE(4)
      depth = body[8]
      type = body[9]
      interlace = body[12]
    } else if (kind === 'IDAT') idat.push(body)
    else if (kind === 'IEND') break
    off += 12 + len
  }
  const channels = { 0: 1, 2: 3, 4: 2, 6: 4 }[type]
  if (depth !== 8 || !channels || interlace !== 0) throw new Error(`unsupported PNG: depth ${depth}, colour type ${type}, interlace ${interlace}`)
  const raw = inflateSync(Buffer.concat(idat))
  const stride = width * channels
  const data = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const f = raw[y * (stride + 1)]
    const src = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const row = data.subarray(y * stride, (y + 1) * stride)
    const prev = y > 0 ? data.subarray((y - 1) * stride, y * stride) : Buffer.alloc(stride)
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? row[i - channels] : 0
      const b = prev[i]
      const c = i >= channels ? prev[i - channels] : 0
      let v = src[i]
      switch (f) {
        case 0: break
        case 1: v += a; break
        case 2: v += b; break
        case 3: v += (a + b) >> 1; break
        case 4: {
          const p = a + b - c
          const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c)
          v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c
          break
        }
        default: throw new Error(`bad PNG filter ${f} on row ${y}`)
      }
      row[i] = v & 0xff
    }
  }
  return { width, height, channels, data }
}

// pixel returns the [r, g, b] of (x, y).
export function pixel(img, x, y) {
  const i = (y * img.width + x) * img.channels
  if (img.channels < 3) return [img.data[i], img.data[i], img.data[i]]
  return [img.data[i], img.data[i + 1], img.data[i + 2]]
}

// count returns how many pixels of the region (x, y, w, h) satisfy fn([r, g, b]).
export function count(img, x, y, w, h, fn) {
  let n = 0
  for (let j = y; j < y + h; j++) for (let i = x; i < x + w; i++) if (fn(pixel(img, i, j))) n++
  return n
}

// distinct returns how many different colours the image has (stops counting at limit).
export function distinct(img, limit = 1000) {
  const seen = new Set()
  for (let i = 0; i < img.width * img.height && seen.size < limit; i++) {
    const o = i * img.channels
    seen.add(img.channels < 3 ? img.data[o] : (img.data[o] << 16) | (img.data[o + 1] << 8) | img.data[o + 2])
  }
  return seen.size
}
