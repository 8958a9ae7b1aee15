// The dashboard's list pages: sandboxes, templates and builds, the audit
// trail, egress approvals, usage and secrets.
import * as api from './api.js';
import { el, set, table, bytes, when, status } from './dom.js';

function recordRow(r) {
  return [String(r.seq), when(r.time), r.type, r.sandbox || '', r.actor || '', r.data ? JSON.stringify(r.data) : ''];
}
const recordHeaders = ['seq', 'time', 'type', 'sandbox', 'actor', 'data'];

async function sandboxes(root, signal) {
  const state = el('select', { id: 'f-state' },
    el('option', { value: 'running,paused' }, 'any'), el('option', { value: 'running' }, 'running'), el('option', { value: 'paused' }, 'paused'));
  const tmpl = el('input', { id: 'f-template', type: 'search', placeholder: 'base' });
  const meta = el('input', { id: 'f-metadata', type: 'search', placeholder: 'key=value' });
  const list = el('div', { id: 'sandbox-list', 'aria-live': 'polite' });
  // The daemon's key acts for any team (X-Team-ID); other keys see their own.
  const team = api.me() && api.me().admin ? el('input', { id: 'f-team', type: 'search', placeholder: 'team ID' }) : null;
  const teamHeader = () => (team && team.value.trim() ? { 'X-Team-ID': team.value.trim() } : {});
  const create = el('button', { type: 'button', id: 'create-sandbox' }, 'New sandbox');
  root.append(el('h1', {}, 'Sandboxes'),
    el('div', { className: 'row' },
      el('label', { htmlFor: 'f-state' }, 'State'), state,
      el('label', { htmlFor: 'f-template' }, 'Template'), tmpl,
      el('label', { htmlFor: 'f-metadata' }, 'Metadata'), meta,
      team ? [el('label', { htmlFor: 'f-team' }, 'Team'), team] : null, create),
    list);
  let pending = false;
  const refresh = async () => {
    if (pending || signal.aborted) return;
    pending = true;
    try {
      const q = new URLSearchParams({ state: state.value, limit: '100' });
      if (meta.value.trim()) q.set('metadata', meta.value.trim());
      const all = await api.call('GET', '/v2/sandboxes?' + q, undefined, teamHeader());
      const t = tmpl.value.trim();
      const shown = all.filter((s) => !t || s.templateID === t || s.alias === t);
      set(list, shown.length ? table(['sandbox', 'template', 'state', 'started', 'ends', 'metadata'],
        shown.map((s) => [
          el('a', { href: '#/sandbox/' + encodeURIComponent(s.sandboxID), className: 'sandbox-link', dataset: { id: s.sandboxID } }, s.sandboxID),
          s.alias || s.templateID, s.state, when(s.startedAt), when(s.endAt),
          Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', '),
        ]), `${shown.length} sandboxes`) : status('No sandboxes.'));
    } catch (e) {
      set(list, el('p', { className: 'error', role: 'alert' }, e.message));
    } finally {
      pending = false;
    }
  };
  for (const c of [state, tmpl, meta, team]) if (c) c.addEventListener('change', refresh);
  create.addEventListener('click', async () => {
    const t = tmpl.value.trim() || 'base';
    try {
      const s = await api.call('POST', '/sandboxes', { templateID: t, timeout: 300 });
      location.hash = '#/sandbox/' + encodeURIComponent(s.sandboxID);
    } catch (e) {
      list.prepend(el('p', { className: 'error', role: 'alert' }, e.message));
    }
  });
  await refresh();
  // Lifecycle records of the audit trail refresh the list as they happen.
  api.live('/audit/stream?since=1s&type=sandbox.create,sandbox.kill,sandbox.pause,sandbox.resume,sandbox.rewind,sandbox.fork', signal, refresh);
  const timer = setInterval(refresh, 10000);
  signal.addEventListener('abort', () => clearInterval(timer));
}

async function templates(root, signal, [id, build]) {
  root.append(el('h1', {}, 'Templates'),
    el('p', { className: 'muted' }, "fence's own templates (minimal, base, code-interpreter, …) are every team's; below are the team's built templates and snapshots."));
  const list = await api.call('GET', '/templates');
  if (!(list || []).length) root.append(status('No built templates.'));
  else root.append(table(['template', 'aliases', 'public', 'CPU', 'memory', 'builds'],
    (list || []).map((t) => [
      el('a', { href: '#/templates/' + encodeURIComponent(t.templateID) }, t.templateID),
      (t.aliases || []).join(', '), t.public ? 'yes' : 'no', String(t.cpuCount ?? ''), t.memoryMB ? `${t.memoryMB} MiB` : '',
      String(t.buildCount ?? ''),
    ])));
  if (!id) return;
  const t = await api.call('GET', '/templates/' + encodeURIComponent(id));
  root.append(el('h2', {}, `Builds of ${id}`), table(['build', 'status', 'created', 'logs'],
    (t.builds || []).map((b) => [b.buildID, b.status, when(b.createdAt),
      el('a', { href: `#/templates/${encodeURIComponent(id)}/${encodeURIComponent(b.buildID)}` }, 'logs')])));
  if (!build) return;
  const logs = el('pre', { id: 'build-logs', tabindex: 0, role: 'region', 'aria-label': 'build logs' });
  const st = el('p', { role: 'status' });
  root.append(el('h2', {}, `Build ${build}`), st, logs);
  // The build's lines as they are written, until it ends (one stream).
  const show = (s) => {
    for (const e of s.logEntries || []) logs.append(`${when(e.timestamp)} ${e.level} ${e.message}\n`);
    set(st, `status: ${s.status}${s.reason ? ' · ' + (s.reason.message || '') : ''}`);
  };
  const path = `/templates/${encodeURIComponent(id)}/builds/${encodeURIComponent(build)}/logs/stream`;
  api.events(path, signal, show).catch((e) => { if (!signal.aborted) set(st, e.message); });
}

async function auditPage(root, signal) {
  const sbx = el('input', { id: 'a-sandbox', type: 'search' });
  const types = el('input', { id: 'a-type', type: 'search', placeholder: 'sandbox.create,egress.flow' });
  const since = el('input', { id: 'a-since', type: 'search', value: '1h' });
  const tail = el('input', { id: 'a-tail', type: 'checkbox' });
  const out = el('div', { id: 'audit-records', className: 'tail', tabindex: 0, role: 'region', 'aria-label': 'audit records' });
  const count = el('p', { role: 'status', id: 'audit-count' });
  const go = el('button', { type: 'submit' }, 'Apply');
  const form = el('form', { className: 'row' },
    el('label', { htmlFor: 'a-sandbox' }, 'Sandbox'), sbx, el('label', { htmlFor: 'a-type' }, 'Types'), types,
    el('label', { htmlFor: 'a-since' }, 'Since'), since, tail, el('label', { htmlFor: 'a-tail' }, 'Live tail'), go);
  const verify = el('p', { id: 'audit-verify', role: 'status' });
  root.append(el('h1', {}, 'Audit trail'),
    el('p', { className: 'muted' }, 'Each record holds the SHA-256 of the one before it, and signed checkpoints cover the chain.'),
    verify, form, count, out);
  if (api.me() && api.me().admin) {
    set(verify, 'Verifying the chain…');
    api.call('GET', '/audit/verify').then((v) => {
      if (!v.intact) {
        set(verify, el('strong', { className: 'error' }, `BROKEN at segment ${v.break.segment} line ${v.break.line} (seq ${v.break.seq}): ${v.break.reason}`));
        return;
      }
      set(verify, el('strong', { className: 'ok' }, 'Intact'),
        `: ${v.records} records (seq ${v.firstSeq} to ${v.lastSeq}) in ${v.segments} segments; ${v.checkpoints} signed checkpoints, the last at seq ${v.lastCheckpoint}; ${v.unsigned} records after it are not signed yet.`,
        v.warnings.length ? el('span', { className: 'muted' }, ' ', v.warnings.join(' · ')) : null);
    }).catch((e) => set(verify, el('span', { className: 'error' }, `Verification: ${e.message}`)));
  } else {
    set(verify, "Verification of the whole chain is the operator's (the daemon's key, or `fence audit verify` on the host).");
  }
  let stream = null;
  const load = async () => {
    if (stream) stream.abort();
    const q = new URLSearchParams({ limit: '500' });
    if (sbx.value.trim()) q.set('sandbox', sbx.value.trim());
    if (types.value.trim()) q.set('type', types.value.trim());
    if (since.value.trim()) q.set('since', since.value.trim());
    const recs = await api.call('GET', '/audit?' + q);
    const rows = (recs || []).map(recordRow);
    const body = el('tbody', {}, rows.map((r) => el('tr', {}, r.map((c) => el('td', {}, c)))));
    set(out, el('table', {}, el('thead', {}, el('tr', {}, recordHeaders.map((h) => el('th', { scope: 'col' }, h)))), body));
    set(count, `${rows.length} records`);
    if (tail.checked) {
      stream = new AbortController();
      signal.addEventListener('abort', () => stream.abort());
      const last = recs && recs.length ? recs[recs.length - 1].seq : 0;
      q.delete('limit'); q.delete('since');
      q.set('after', String(last));
      api.live('/audit/stream?' + q, stream.signal, (r) => {
        body.append(el('tr', {}, recordRow(r).map((c) => el('td', {}, c))));
        out.scrollTop = out.scrollHeight;
      });
    }
  };
  form.addEventListener('submit', (e) => { e.preventDefault(); load().catch((err) => set(count, err.message)); });
  tail.addEventListener('change', () => load());
  await load();
}

async function approvals(root, signal) {
  const list = el('div', { id: 'approval-list', 'aria-live': 'polite' });
  root.append(el('h1', {}, 'Egress approvals'),
    el('p', { className: 'muted' }, 'Lookups of sandboxes created with network approval "ask" wait here for a decision.'), list);
  const refresh = async () => {
    let reqs;
    try { reqs = await api.call('GET', '/approvals'); } catch (e) { set(list, el('p', { className: 'error' }, e.message)); return; }
    const decide = (id, decision) => async () => {
      try { await api.call('POST', '/approvals/' + encodeURIComponent(id), { decision }); } catch (e) { list.prepend(el('p', { className: 'error', role: 'alert' }, e.message)); }
      refresh();
    };
    set(list, (reqs || []).length ? table(['name', 'sandbox', 'asked', 'deadline', 'decision'], reqs.map((r) => [
      r.name, el('a', { href: '#/sandbox/' + encodeURIComponent(r.sandboxID) }, r.sandboxID), when(r.created), when(r.deadline),
      el('span', { className: 'row' },
        el('button', { type: 'button', onclick: decide(r.id, 'once') }, 'Allow once'),
        el('button', { type: 'button', onclick: decide(r.id, 'sandbox') }, 'Allow for sandbox'),
        el('button', { type: 'button', className: 'danger', onclick: decide(r.id, 'deny') }, 'Deny')),
    ])) : status('Nothing waits for a decision.'));
  };
  await refresh();
  api.live('/approvals/stream', signal, refresh);
}

function bars(label, rows, key, fmt) {
  const max = Math.max(1e-9, ...rows.map((r) => r[key] || 0));
  return el('figure', {}, el('figcaption', {}, label),
    el('table', {}, el('tbody', {}, rows.map((r) => {
      const m = el('meter', { min: 0, max, value: r[key] || 0, title: fmt(r[key] || 0) });
      m.setAttribute('aria-label', `${label} of ${r.actor}`);
      return el('tr', {}, el('td', {}, r.actor), el('td', {}, m), el('td', {}, fmt(r[key] || 0)));
    }))));
}

async function usage(root) {
  const u = await api.call('GET', '/usage');
  const keys = u.keys || [];
  const sec = (v) => `${Number(v).toFixed(1)} s`;
  root.append(el('h1', {}, 'Usage'),
    el('p', { className: 'muted' }, 'Per team and key (the actor of the requests that made the sandboxes).'),
    el('div', { className: 'grid' },
      bars('CPU seconds', keys, 'cpu_seconds', sec),
      bars('Memory GiB·s', keys, 'memory_gib_seconds', (v) => Number(v).toFixed(2)),
      bars('Egress out', keys, 'egress_bytes_out', bytes)),
    el('h2', {}, 'Sandboxes'),
    table(['sandbox', 'actor', 'template', 'state', 'CPU s', 'running s', 'egress out'], (u.sandboxes || []).map((s) => [
      s.sandbox_id, s.actor, s.template, s.state, Number(s.cpu_seconds).toFixed(1), Number(s.running_seconds).toFixed(0), bytes(s.egress_bytes_out),
    ])));
}

async function secrets(root) {
  const list = await api.call('GET', '/secrets');
  root.append(el('h1', {}, 'Secrets'),
    el('p', { className: 'muted' }, 'Names and metadata only: values never leave the daemon except into the egress gateway. A sandbox binds a secret to hosts at create (its network policy shows the bindings).'),
    table(['name', 'ID', 'version', 'metadata', 'updated'], (list || []).map((s) => [
      s.name, s.secretID, String(s.currentVersion), Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(', '), when(s.updatedAt),
    ])));
}

export const pages = { sandboxes, templates, audit: auditPage, approvals, usage, secrets };
