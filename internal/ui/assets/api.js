// The dashboard's calls: fence's own JSON routes with the session cookie
// and its CSRF token, and the sandbox agent (envd) through the daemon's
// sandbox proxy with the sandbox's access token.

let csrf = '';
let who = null;
let onUnauthorized = () => {};

export function setSession(s, unauthorized) {
  who = s || null;
  csrf = (s && s.csrfToken) || '';
  if (unauthorized) onUnauthorized = unauthorized;
}

// me is the signed-in session: {team, keyID, admin}.
export function me() { return who; }

export class APIError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function answer(r) {
  const text = await r.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!r.ok) {
    if (r.status === 401) onUnauthorized();
    throw new APIError(r.status, (data && data.message) || `${r.status} ${r.statusText}`);
  }
  return data;
}

// call sends method path (a fence route) with body as JSON, and extra
// headers.
export async function call(method, path, body, extra = {}) {
  const headers = { ...extra, 'X-Fence-CSRF': csrf };
  const init = { method, headers, credentials: 'same-origin' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  return answer(await fetch(path, init));
}

export async function session() {
  return answer(await fetch('/ui/session', { credentials: 'same-origin' }));
}

export async function login(apiKey) {
  return answer(await fetch('/ui/session', {
    method: 'POST', credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ apiKey }),
  }));
}

export async function logout() {
  return answer(await fetch('/ui/session', { method: 'DELETE', credentials: 'same-origin', headers: { 'X-Fence-CSRF': csrf } }));
}

// events reads a server-sent event stream (fetch, so that the CSRF header
// goes along) and calls onEvent(data, id) for each, until signal aborts.
export async function events(path, signal, onEvent) {
  const r = await fetch(path, { headers: { 'X-Fence-CSRF': csrf }, credentials: 'same-origin', signal });
  if (!r.ok) return answer(r);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let id = '', data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('id:')) id = line.slice(3).trim();
        else if (line.startsWith('data:')) data += line.slice(5).trim();
      }
      if (data) {
        try { onEvent(JSON.parse(data), id); } catch (e) { console.error(e); }
      }
    }
  }
}

// live runs events again after it ends, until signal aborts.
export function live(path, signal, onEvent) {
  (async () => {
    while (!signal.aborted) {
      try { await events(path, signal, onEvent); } catch (e) { if (signal.aborted) return; }
      await new Promise((r) => setTimeout(r, 2000));
    }
  })();
}

const enc = new TextEncoder();

export function toBase64(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

export function fromBase64(b64) {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

// Envd speaks to one sandbox's agent (envd's Connect and /files API).
export class Envd {
  constructor(id, token) { this.id = id; this.token = token; }

  headers(extra = {}) {
    const h = { 'E2b-Sandbox-Id': this.id, 'E2b-Sandbox-Port': '49983', ...extra };
    if (this.token) h['X-Access-Token'] = this.token;
    return h;
  }

  async unary(method, msg) {
    const r = await fetch('/' + method, {
      method: 'POST', credentials: 'omit',
      headers: this.headers({ 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' }),
      body: JSON.stringify(msg),
    });
    return answer(r);
  }

  // stream calls a server-streaming method; onMsg gets each message.
  async stream(method, msg, signal, onMsg) {
    const body = enc.encode(JSON.stringify(msg));
    const framed = new Uint8Array(5 + body.length);
    new DataView(framed.buffer).setUint32(1, body.length);
    framed.set(body, 5);
    const r = await fetch('/' + method, {
      method: 'POST', credentials: 'omit', signal,
      headers: this.headers({ 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1' }),
      body: framed,
    });
    if (!r.ok) return answer(r);
    const reader = r.body.getReader();
    let buf = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const next = new Uint8Array(buf.length + value.length);
      next.set(buf); next.set(value, buf.length);
      buf = next;
      while (buf.length >= 5) {
        const n = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
        if (buf.length < 5 + n) break;
        const flags = buf[0];
        const m = JSON.parse(new TextDecoder().decode(buf.subarray(5, 5 + n)) || '{}');
        buf = buf.slice(5 + n);
        if (flags & 2) {
          if (m.error) throw new APIError(0, m.error.message || m.error.code);
          return;
        }
        onMsg(m);
      }
    }
  }

  listDir(path) { return this.unary('filesystem.Filesystem/ListDir', { path, depth: 1 }); }

  async upload(dir, file) {
    const fd = new FormData();
    fd.append('file', file, file.name);
    const path = dir.replace(/\/$/, '') + '/' + file.name;
    const r = await fetch('/files?path=' + encodeURIComponent(path), {
      method: 'POST', credentials: 'omit', headers: this.headers(), body: fd,
    });
    return answer(r);
  }

  async download(path) {
    const r = await fetch('/files?path=' + encodeURIComponent(path), { credentials: 'omit', headers: this.headers() });
    if (!r.ok) return answer(r);
    return r.blob();
  }
}
