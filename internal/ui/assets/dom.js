// DOM helpers. Every string becomes a text node: nothing here parses
// HTML, so a name a sandbox chose (a file, an output line, an audit
// field) is shown as the characters it is.

// el makes an element: attrs are properties or attributes (on* keys add
// listeners), children are nodes, strings (text), or arrays of them.
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
    else if (k === 'text') e.textContent = String(v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k in e && typeof e[k] !== 'object' && !k.includes('-')) e[k] = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  append(e, children);
  return e;
}

function append(e, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// set replaces the children of e.
export function set(e, ...children) {
  e.replaceChildren();
  append(e, children);
  return e;
}

export function table(headers, rows, caption) {
  return el('table', {},
    caption ? el('caption', { className: 'muted' }, caption) : null,
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, rows.map((r) => el('tr', {}, r.map((c) => el('td', {}, c))))));
}

const SVG = 'http://www.w3.org/2000/svg';

// sparkline draws values as a polyline, labelled for screen readers.
export function sparkline(label, values, fmt = (v) => String(v)) {
  const w = 160, h = 36;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('width', w);
  svg.setAttribute('height', h);
  svg.setAttribute('role', 'img');
  const last = values.length ? values[values.length - 1] : null;
  svg.setAttribute('aria-label', `${label}: ${last === null ? 'no readings' : fmt(last)}`);
  if (values.length) {
    const max = Math.max(...values, 1e-9);
    const step = values.length > 1 ? w / (values.length - 1) : 0;
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', values.map((v, i) => `${(i * step).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`).join(' '));
    svg.append(line);
  }
  return el('figure', { className: 'spark' }, svg,
    el('figcaption', {}, `${label}: ${last === null ? '–' : fmt(last)}`));
}

export function bytes(n) {
  if (n === undefined || n === null) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

export function when(t) {
  if (!t) return '';
  const d = new Date(t);
  return isNaN(d) ? String(t) : d.toLocaleString();
}

export function status(msg, cls = 'muted') {
  return el('p', { className: cls, role: 'status' }, msg);
}
