// One sandbox: actions, metrics, network policy, live egress decisions,
// a terminal on its PTY, files, checkpoints (diff and rewind) and logs.
import * as api from './api.js';
import { el, set, table, sparkline, bytes, when, status } from './dom.js';
import { Terminal } from './vendor/xterm.mjs';

const enc = new TextEncoder();

export async function sandboxPage(root, signal, [id]) {
  const info = await api.call('GET', '/sandboxes/' + encodeURIComponent(id));
  const envd = new api.Envd(id, info.envdAccessToken);
  const msg = el('p', { id: 'sandbox-status', role: 'status' });
  const act = (label, fn, cls) => el('button', { type: 'button', className: cls || '', id: 'act-' + label.toLowerCase(), onclick: async () => {
    try { set(msg, await fn()); } catch (e) { set(msg, el('span', { className: 'error' }, `${label}: ${e.message}`)); }
  } }, label);
  root.append(
    el('h1', {}, 'Sandbox ', el('span', { id: 'sandbox-id' }, id)),
    el('p', {}, `${info.alias || info.templateID} · ${info.state} · started ${when(info.startedAt)} · ends ${when(info.endAt)} · ${info.cpuCount} CPU · ${info.memoryMB} MiB`),
    el('div', { className: 'row' },
      act('Pause', async () => { await api.call('POST', `/sandboxes/${id}/pause`, {}); return 'Paused.'; }),
      act('Resume', async () => { await api.call('POST', `/sandboxes/${id}/resume`, {}); return 'Resumed.'; }),
      act('Fork', async () => {
        const forks = await api.call('POST', `/sandboxes/${id}/fork`, { count: 1, timeout: 300 });
        const f = forks[0] || {};
        return f.sandbox ? el('span', {}, 'Forked: ', el('a', { href: '#/sandbox/' + encodeURIComponent(f.sandbox.sandboxID) }, f.sandbox.sandboxID))
          : `Fork failed: ${f.error ? f.error.message : 'no answer'}`;
      }),
      act('Snapshot', async () => { const s = await api.call('POST', `/sandboxes/${id}/snapshots`, {}); return `Snapshot ${s.snapshotID}`; }),
      act('Kill', async () => { await api.call('DELETE', `/sandboxes/${id}`); return 'Killed.'; }, 'danger')),
    msg);
  const grid = el('div', { className: 'grid' });
  root.append(grid);
  grid.append(metricsSection(id, signal), networkSection(info), egressSection(id, signal));
  root.append(terminalSection(envd, signal), filesSection(envd), checkpointsSection(id), logsSection(id));
}

function section(title, idPrefix, ...children) {
  return el('section', { 'aria-labelledby': idPrefix + '-title', id: idPrefix + '-section' }, el('h2', { id: idPrefix + '-title' }, title), ...children);
}

// netSpark draws the bytes of the flows ended between readings, from
// their running totals, and says the total.
function netSpark(label, totals) {
  const per = totals.map((v, i) => (i ? Math.max(v - totals[i - 1], 0) : 0));
  const total = totals.length ? totals[totals.length - 1] : 0;
  return sparkline(label, per, (v) => `${bytes(v)} (${bytes(total)} in all)`);
}

function metricsSection(id, signal) {
  const box = el('div', { id: 'metrics' }, status('Loading…'));
  const load = async () => {
    const start = Math.floor(Date.now() / 1000) - 600;
    const m = (await api.call('GET', `/sandboxes/${id}/metrics?start=${start}`)) || [];
    set(box,
      sparkline('CPU', m.map((r) => r.cpuUsedPct), (v) => `${v.toFixed(1)} %`),
      sparkline('Memory', m.map((r) => r.memUsed), bytes),
      sparkline('Disk', m.map((r) => r.diskUsed), bytes),
      netSpark('Network out', m.map((r) => r.egressBytesOut || 0)),
      netSpark('Network in', m.map((r) => r.egressBytesIn || 0)));
  };
  load().catch((e) => set(box, el('p', { className: 'error' }, e.message)));
  const timer = setInterval(() => load().catch(() => {}), 5000);
  signal.addEventListener('abort', () => clearInterval(timer));
  return section('Metrics', 'metrics', box);
}

function networkSection(info) {
  const policy = { allowInternetAccess: info.allowInternetAccess, ...(info.network || {}) };
  return section('Network policy', 'network', el('pre', { id: 'network-policy', tabindex: 0, role: 'region', 'aria-label': 'network policy' }, JSON.stringify(policy, null, 2)));
}

function egressSection(id, signal) {
  const list = el('ul', { id: 'egress-list', className: 'tail', tabindex: 0, 'aria-label': 'egress decisions' });
  api.live(`/audit/stream?sandbox=${encodeURIComponent(id)}&type=egress.flow,egress.approval,gateway.request`, signal, (r) => {
    const d = r.data || {};
    list.append(el('li', {}, `${when(r.time)} ${r.type} ${d.decision || d.verdict || ''} ${d.host || d.name || d.dst || ''} ${JSON.stringify(d)}`));
    list.scrollTop = list.scrollHeight;
  });
  return section('Egress decisions (live)', 'egress', list);
}

function terminalSection(envd, signal) {
  const holder = el('div', { id: 'terminal', role: 'region', 'aria-label': 'terminal' });
  const open = el('button', { type: 'button', id: 'open-terminal' }, 'Open terminal');
  const st = el('p', { role: 'status', id: 'terminal-status' });
  open.addEventListener('click', async () => {
    open.disabled = true;
    const term = new Terminal({ cols: 100, rows: 18, convertEol: false, fontSize: 13 });
    term.open(holder);
    let pid = 0;
    const queue = [];
    const send = (data) => envd.unary('process.Process/SendInput', { process: { pid }, input: { pty: api.toBase64(enc.encode(data)) } })
      .catch((e) => set(st, e.message));
    term.onData((d) => { if (pid) send(d); else queue.push(d); });
    const ctl = new AbortController();
    signal.addEventListener('abort', () => { ctl.abort(); term.dispose(); });
    set(st, 'Connecting…');
    try {
      await envd.stream('process.Process/Start', {
        process: { cmd: '/bin/sh', args: ['-c', 'if command -v bash >/dev/null 2>&1; then exec bash -l -i; else exec sh -i; fi'], envs: { TERM: 'xterm-256color' } },
        pty: { size: { cols: term.cols, rows: term.rows } },
      }, ctl.signal, (m) => {
        const ev = m.event || {};
        if (ev.start) {
          pid = ev.start.pid;
          holder.dataset.pid = String(pid);
          set(st, `Connected (pid ${pid}).`);
          term.focus();
          for (const d of queue.splice(0)) send(d);
        } else if (ev.data && ev.data.pty) {
          term.write(api.fromBase64(ev.data.pty));
        } else if (ev.end) {
          set(st, `Exited${ev.end.status ? ': ' + ev.end.status : ''}.`);
        }
      });
    } catch (e) {
      if (!ctl.signal.aborted) set(st, `Terminal ended: ${e.message}`);
    }
    open.disabled = false;
  });
  return section('Terminal', 'terminal', el('div', { className: 'row' }, open), st, holder);
}

function filesSection(envd) {
  const dir = el('input', { id: 'files-path', type: 'text', value: '/tmp' });
  const list = el('div', { id: 'files-list', 'aria-live': 'polite' });
  const upload = el('input', { id: 'upload-input', type: 'file' });
  const st = el('p', { role: 'status', id: 'files-status' });
  const load = async () => {
    try {
      const r = await envd.listDir(dir.value);
      const entries = (r.entries || []).sort((a, b) => a.name.localeCompare(b.name));
      set(list, table(['name', 'type', 'size', 'modified', ''], entries.map((e) => [
        el('span', { className: 'file-name' }, e.name),
        (e.type || '').replace('FILE_TYPE_', '').toLowerCase(), bytes(Number(e.size || 0)), when(e.modifiedTime),
        (e.type || '').includes('DIR') ? el('button', { type: 'button', onclick: () => { dir.value = e.path; load(); } }, 'Open')
          : el('button', { type: 'button', onclick: () => download(e.path, e.name) }, 'Download'),
      ])));
    } catch (e) {
      set(list, el('p', { className: 'error' }, e.message));
    }
  };
  const download = async (path, name) => {
    try {
      const blob = await envd.download(path);
      const a = el('a', { href: URL.createObjectURL(blob), download: name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    } catch (e) { set(st, e.message); }
  };
  upload.addEventListener('change', async () => {
    for (const f of upload.files) {
      try { await envd.upload(dir.value, f); set(st, `Uploaded ${f.name}.`); } catch (e) { set(st, `Upload of ${f.name}: ${e.message}`); }
    }
    upload.value = '';
    load();
  });
  const form = el('form', { className: 'row' }, el('label', { htmlFor: 'files-path' }, 'Directory'), dir,
    el('button', { type: 'submit', id: 'files-go' }, 'List'),
    el('label', { htmlFor: 'upload-input' }, 'Upload'), upload);
  form.addEventListener('submit', (e) => { e.preventDefault(); load(); });
  load();
  return section('Files', 'files', form, st, list);
}

function checkpointsSection(id) {
  const name = el('input', { id: 'checkpoint-name', type: 'text' });
  const list = el('ol', { id: 'checkpoint-list', className: 'timeline' });
  const from = el('select', { id: 'diff-from' });
  const to = el('select', { id: 'diff-to' });
  const diff = el('div', { id: 'diff-result', 'aria-live': 'polite' });
  const st = el('p', { role: 'status', id: 'checkpoint-status' });
  const load = async () => {
    const cps = (await api.call('GET', `/sandboxes/${id}/checkpoints`)) || [];
    const opts = (first) => [el('option', { value: '' }, first), ...cps.map((c) => el('option', { value: c.checkpointID }, `${c.name || c.checkpointID} (${when(c.createdAt)})`))];
    const keep = [from.value, to.value];
    set(from, opts('as created'));
    set(to, opts('now'));
    from.value = keep[0] || (cps.length ? cps[cps.length - 1].checkpointID : '');
    to.value = keep[1] || '';
    set(list, cps.map((c) => el('li', { dataset: { id: c.checkpointID } },
      el('strong', {}, c.name || c.checkpointID), ` ${when(c.createdAt)} · ${c.files} files · ${bytes(c.bytes)}${c.auto ? ' · auto' : ''} `,
      el('button', { type: 'button', className: 'rewind', dataset: { id: c.checkpointID }, onclick: async () => {
        try {
          await api.call('POST', `/sandboxes/${id}/rewind`, { checkpointID: c.checkpointID });
          set(st, `Rewound to ${c.name || c.checkpointID}.`);
        } catch (e) { set(st, el('span', { className: 'error' }, e.message)); }
      } }, `Rewind to ${c.name || 'this checkpoint'}`))));
  };
  const take = el('button', { type: 'button', id: 'checkpoint-button', onclick: async () => {
    try {
      const body = name.value.trim() ? { name: name.value.trim() } : {};
      const c = await api.call('POST', `/sandboxes/${id}/checkpoints`, body);
      set(st, `Checkpoint ${c.name || c.checkpointID} taken.`);
      name.value = '';
      await load();
    } catch (e) { set(st, el('span', { className: 'error' }, e.message)); }
  } }, 'Take checkpoint');
  const show = el('button', { type: 'button', id: 'diff-button', onclick: async () => {
    try {
      const q = new URLSearchParams({ from: from.value, to: to.value });
      const d = (await api.call('GET', `/sandboxes/${id}/diff?${q}`)) || [];
      set(diff, d.length ? table(['change', 'path', 'kind', 'size', 'before'], d.map((c) => [
        el('span', { className: c.change }, c.change), el('span', { className: 'diff-path' }, c.path), c.kind || '', bytes(c.size), c.oldSize !== undefined ? bytes(c.oldSize) : '',
      ])) : status('No changes.'));
    } catch (e) { set(diff, el('p', { className: 'error' }, e.message)); }
  } }, 'Show diff');
  load().catch((e) => set(st, e.message));
  return section('Checkpoints', 'checkpoints',
    el('div', { className: 'row' }, el('label', { htmlFor: 'checkpoint-name' }, 'Name'), name, take), st, list,
    el('div', { className: 'row' }, el('label', { htmlFor: 'diff-from' }, 'From'), from, el('label', { htmlFor: 'diff-to' }, 'To'), to, show),
    diff);
}

function logsSection(id) {
  const pre = el('pre', { id: 'sandbox-logs', tabindex: 0, role: 'region', 'aria-label': 'sandbox logs' });
  const load = async () => {
    const r = await api.call('GET', `/v2/sandboxes/${id}/logs?limit=200&direction=backward`);
    set(pre, (r.logs || []).reverse().map((l) => `${when(l.timestamp)} ${l.level} ${l.message}\n`));
  };
  const refresh = el('button', { type: 'button', id: 'logs-refresh', onclick: () => load().catch((e) => set(pre, e.message)) }, 'Refresh logs');
  load().catch((e) => set(pre, e.message));
  return section('Logs', 'logs', el('div', { className: 'row' }, refresh), pre);
}
