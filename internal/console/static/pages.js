// The fleet, memory and charts pages.
import { h, api, fmtTime, scroller, notice } from './lib.js';
import { highlight } from './hl.js';

const every = (ms, fn, signal) => {
  const t = setInterval(() => fn().catch(() => {}), ms);
  signal.addEventListener('abort', () => clearInterval(t));
};

// ---- Fleet ----

export async function fleetPage(show, signal) {
  const body = h('div', { id: 'fleet' });
  show('Fleet', body);
  const th = (cols) => h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c))));
  const table = (id, caption, cols, rows) => scroller(caption + ' table', h('table', { id }, h('caption', { class: 'sr' }, caption), th(cols), h('tbody', {}, rows)));
  const state = (cls, text) => h('span', { class: 'badge ' + cls }, text);
  const render = async () => {
    const f = await api('/api/console/fleet', { signal });
    // Counts that move with every tenant's work are an admin's to see.
    const n = (v) => (f.counts_hidden ? '—' : v);
    const brokers = table('brokers', 'Brokers', ['Broker', 'Role', 'Leads', 'Replica of (lag)'], f.brokers.map((b) => h('tr', { 'data-id': b.name },
      h('td', { class: 'mono' }, b.name), h('td', {}, b.behind ? state('st-worker_lost', 'behind') : state('st-success', b.leads.length ? 'leader' : 'replica')),
      h('td', {}, b.leads.join(', ')), h('td', {}, b.follows.join(', ')))));
    const streams = table('streams', 'Streams', ['Stream', 'Messages', 'Size', 'Leader', 'Replicas'], f.streams.map((s) => h('tr', {},
      h('td', { class: 'mono' }, s.name), h('td', {}, s.error ? '' : n(s.messages)), h('td', {}, s.error ? s.error : n(kb(s.bytes))), h('td', { class: 'mono' }, s.leader || ''),
      h('td', {}, (s.replicas || []).map((r) => r.name + (r.offline ? ' offline' : r.current ? '' : ' catching up') + ' (lag ' + r.lag + ')').join(', ')))));
    const workers = table('workers', 'Workers',
      ['Worker', 'State', 'Runtime', 'Slots busy / free', 'Warm pool', 'Sessions', 'Host load', 'Languages', 'Sandboxes started', 'Last heartbeat'],
      f.workers.map((w) => h('tr', { class: w.stale ? 'stale' : '', 'data-id': w.id },
        h('td', { class: 'mono' }, w.id),
        h('td', {}, w.stale ? state('st-worker_lost', 'stale') : w.healthy ? state('st-success', 'healthy') : state('st-error', 'unhealthy'), w.reason ? ' ' + w.reason : ''),
        h('td', {}, w.runtime || ''), h('td', {}, f.counts_hidden ? '— / ' + w.slots : w.running + ' / ' + Math.max(0, w.slots - w.running)), h('td', {}, n(w.warm)), h('td', {}, n(w.sessions)),
        h('td', {}, w.load1 ? w.load1.toFixed(2) : n('')), h('td', {}, (w.languages || []).join(', ')),
        h('td', {}, n(w.sandboxes_started + (w.sandbox_start_failures ? ' (' + w.sandbox_start_failures + ' failed)' : ''))),
        h('td', { class: 'seen' }, fmtTime(w.last_seen)))));
    const fes = table('frontends', 'Front-ends', ['Front-end', 'State', 'Broker', 'Proxied servers', 'Proxy calls per minute', 'Running calls', 'Last answer'],
      f.frontends.map((fe) => h('tr', { class: fe.stale ? 'stale' : '', 'data-id': fe.id },
        h('td', { class: 'mono' }, fe.id + (fe.this ? ' (this one)' : '')),
        h('td', {}, fe.stale ? state('st-worker_lost', 'stale') : state('st-success', 'answering')),
        h('td', { class: 'mono' }, fe.broker || ''),
        h('td', {}, fe.servers.length ? fe.servers.map((s) => h('span', { class: 'tag' }, s.name + (s.running ? ' (running)' : ' (idle)'))) : 'none'),
        h('td', {}, n(fe.calls_per_minute.toFixed(1))), h('td', {}, n(fe.running)),
        h('td', { class: 'seen' }, fmtTime(fe.last_seen)))));
    body.replaceChildren(...[
      f.error ? notice(f.error, 'error') : null,
      h('h2', {}, 'Brokers' + (f.cluster ? ' (cluster ' + f.cluster + ')' : '')), brokers,
      h('h2', {}, 'Streams'), streams,
      h('h2', {}, 'Workers'), f.workers.length ? workers : h('p', {}, 'No worker has answered.'),
      h('h2', {}, 'Front-ends'), fes,
      h('p', { class: 'muted' }, 'A worker or front-end that has not answered for 15 s is stale.'),
      f.counts_hidden ? h('p', { class: 'muted' }, 'Counts that move with every namespace\'s work (—) are shown to admin tokens only.') : null].filter(Boolean));
  };
  await render();
  every(5000, render, signal);
}

const kb = (n) => (n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + ' MiB' : (n / 1024).toFixed(1) + ' KiB');

// ---- Memory ----

export async function memoryPage(show, params, signal) {
  const prefix = (params.get('prefix') || '').slice(0, 1024);
  const input = h('input', { id: 'm-prefix', name: 'prefix', value: prefix, maxlength: 1024, spellcheck: 'false' });
  const filter = h('form', { class: 'filters', 'aria-label': 'Filter memory', onsubmit: (e) => {
    e.preventDefault();
    location.hash = '#/memory' + (input.value ? '?prefix=' + encodeURIComponent(input.value) : '');
  } }, h('div', { class: 'field' }, h('label', { for: 'm-prefix' }, 'Key prefix'), input), h('button', { type: 'submit' }, 'Filter'));
  const list = h('div', { id: 'memory-list' });
  const editor = h('section', { id: 'editor', 'aria-labelledby': 'h-editor' });
  show('Memory', filter, list, editor);

  const edit = (entry) => {
    const isNew = !entry;
    const key = h('input', { id: 'm-key', value: entry ? entry.key : '', maxlength: 1024, required: true, readonly: !isNew, spellcheck: 'false' });
    const value = h('textarea', { id: 'm-value', rows: 8, spellcheck: 'false' });
    value.value = entry ? JSON.stringify(entry.value, null, 2) : '';
    const msg = h('div', { id: 'm-msg', 'aria-live': 'polite' });
    const version = entry ? entry.version : 0;
    let armed = false;
    const del = entry ? h('button', { type: 'button', id: 'm-delete', class: 'danger', onclick: async () => {
      if (!armed) { armed = true; del.textContent = 'Press again to delete'; return; }
      try {
        await api('/api/console/memory/entry?key=' + encodeURIComponent(entry.key), { method: 'DELETE', signal });
        editor.replaceChildren(notice('Deleted ' + entry.key + '.', ''));
        await load();
      } catch (e) { msg.replaceChildren(notice(e.message, 'error')); }
    } }, 'Delete') : null;
    const form = h('form', { onsubmit: async (e) => {
      e.preventDefault();
      let v;
      try { v = JSON.parse(value.value); } catch (err) { msg.replaceChildren(notice('The value is not JSON: ' + err.message, 'error')); return; }
      try {
        const saved = await api('/api/console/memory/entry', { method: 'PUT', body: { key: key.value, value: v, if_version: version }, signal });
        await load();
        edit(saved);
        document.getElementById('m-msg').replaceChildren(notice('Saved version ' + saved.version + '.', ''));
      } catch (err) {
        msg.replaceChildren(notice(err.status === 409 ? 'Not saved: ' + err.message : err.message, 'error'));
      }
    } },
    h('div', { class: 'field' }, h('label', { for: 'm-key' }, 'Key'), key),
    h('div', { class: 'field' }, h('label', { for: 'm-value' }, 'Value (JSON)'), value),
    h('p', { class: 'muted', id: 'm-version' }, isNew ? 'A new key: saved only if it does not exist yet.' : 'Version ' + version + ', updated ' + fmtTime(entry.updated_at) + '. Saved only if nobody changed it since.'),
    h('div', { class: 'bar' }, h('button', { type: 'submit', id: 'm-save' }, 'Save'), del), msg);
    editor.replaceChildren(h('h2', { id: 'h-editor' }, isNew ? 'New key' : 'Edit ' + entry.key), form);
  };
  const open = async (k) => {
    try { edit(await api('/api/console/memory/entry?key=' + encodeURIComponent(k), { signal })); } catch (e) { editor.replaceChildren(notice(e.message, 'error')); }
  };
  const load = async () => {
    const res = await api('/api/console/memory' + (prefix ? '?prefix=' + encodeURIComponent(prefix) : ''), { signal });
    const rows = res.memories.map((m) => h('tr', {},
      h('td', {}, h('button', { type: 'button', class: 'link mono', 'data-key': m.key, onclick: () => open(m.key) }, m.key)),
      h('td', {}, m.version), h('td', {}, fmtTime(m.updated_at))));
    list.replaceChildren(
      h('div', { class: 'bar' }, h('button', { type: 'button', id: 'm-new', onclick: () => edit(null) }, 'New key'), h('span', { class: 'muted' }, res.memories.length + ' keys')),
      res.memories.length ? scroller('Memory keys', h('table', { id: 'memory' }, h('caption', { class: 'sr' }, 'Memory keys'),
        h('thead', {}, h('tr', {}, ['Key', 'Version', 'Updated'].map((c) => h('th', { scope: 'col' }, c)))), h('tbody', {}, rows))) : h('p', {}, 'No keys.'));
  };
  await load();
}

// ---- Charts ----

const COLORS = { success: '#1a7f37', error: '#b42318', timeout: '#9a6700', cancelled: '#57606a', worker_lost: '#8250df', other: '#0969da' };

export async function chartsPage(show, signal) {
  const body = h('div', { id: 'charts' });
  show('Charts', h('p', { class: 'muted' }, 'The last hour of this process\'s own metrics, sampled every few seconds.'), body);
  const render = async () => {
    const s = await api('/api/console/metrics', { signal });
    const jobs = Object.entries(s.jobs_per_second || {}).map(([st, ys]) => ({ name: st, color: COLORS[st] || COLORS.other, ys }));
    body.replaceChildren(
      chart('Jobs per second by status', s.at, jobs, '/s'),
      chart('Queue depth', s.at, [{ name: 'queued', color: COLORS.other, ys: s.queue_depth }], ''),
      chart('Job latency, submit to end (last minute)', s.at, [{ name: 'p50', color: COLORS.success, ys: s.p50_seconds }, { name: 'p90', color: COLORS.error, ys: s.p90_seconds }], ' s'));
  };
  await render();
  every(10000, render, signal);
}

const SVG = 'http://www.w3.org/2000/svg';
const sv = (tag, attrs) => {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
};

function chart(title, at, series, unit) {
  const W = 600, H = 160, P = 4;
  const vals = series.flatMap((s) => (s.ys || []).filter((v) => v !== null));
  const top = Math.max(1e-9, ...vals);
  const n = (at || []).length;
  const svg = sv('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title, class: 'chart', preserveAspectRatio: 'none' });
  svg.append(sv('line', { x1: 0, y1: H - P, x2: W, y2: H - P, class: 'axis' }));
  for (const s of series) {
    let d = '';
    (s.ys || []).forEach((v, i) => {
      if (v === null) return;
      const x = n > 1 ? (i / (n - 1)) * W : W;
      const y = H - P - (v / top) * (H - 2 * P);
      d += (d && s.ys[i - 1] !== null ? 'L' : 'M') + x.toFixed(1) + ' ' + y.toFixed(1);
    });
    if (d) svg.append(sv('path', { d, fill: 'none', stroke: s.color, 'stroke-width': 2, 'vector-effect': 'non-scaling-stroke' }));
  }
  const last = (ys) => { for (let i = (ys || []).length - 1; i >= 0; i--) if (ys[i] !== null) return ys[i]; return null; };
  const legend = h('ul', { class: 'legend' }, series.map((s) => {
    const v = last(s.ys);
    return h('li', {}, h('span', { class: 'swatch', 'data-color': s.name }), s.name + ': ' + (v === null ? 'none' : Math.round(v * 1000) / 1000 + unit));
  }));
  const fig = h('figure', { class: 'chartbox' }, h('figcaption', {}, title + ' (max ' + Math.round(top * 1000) / 1000 + unit + ')'), n ? svg : h('p', { class: 'muted' }, 'No samples yet.'), legend);
  // The swatches take their series' colour through the CSSOM (CSP allows it; style attributes it would not).
  for (const sw of fig.querySelectorAll('.swatch')) sw.style.background = (series.find((s) => s.name === sw.dataset.color) || {}).color || '#000';
  return fig;
}

// ---- Sessions and saved tools ----

export async function sessionsPage(show, signal) {
  const sessions = h('div', { id: 'sessions' });
  const tools = h('div', { id: 'tools' });
  const msg = h('div', { id: 's-msg', 'aria-live': 'polite' });
  show('Sessions', msg, sessions, h('h2', {}, 'Saved tools'), tools);
  const render = async () => {
    const res = await api('/api/console/sessions', { signal });
    const rows = res.sessions.map((s) => {
      const end = s.ended ? null : h('button', { type: 'button', class: 'danger', 'data-session': s.name, onclick: async () => {
        end.disabled = true;
        try {
          await api('/api/console/sessions/' + encodeURIComponent(s.name) + '/end', { method: 'POST', signal });
          msg.replaceChildren(notice('Ended session ' + s.name + '.', ''));
          await render();
        } catch (e) { msg.replaceChildren(notice(e.message, 'error')); end.disabled = false; }
      } }, 'End');
      return h('tr', { 'data-name': s.name }, h('td', { class: 'mono' }, s.name), h('td', { class: 'state' }, s.ended ? 'ended' : 'live'),
        h('td', { class: 'mono' }, s.worker), h('td', {}, fmtTime(s.since)), h('td', {}, end));
    });
    sessions.replaceChildren(rows.length ? scroller('Sessions table', h('table', { id: 'sessions-table' }, h('caption', { class: 'sr' }, 'Sessions'),
      h('thead', {}, h('tr', {}, ['Session', 'State', 'Worker', 'Since', 'Action'].map((c) => h('th', { scope: 'col' }, c)))), h('tbody', {}, rows)))
      : h('p', {}, 'No sessions: a job that names a session starts one.'));
  };
  const renderTools = async () => {
    const res = await api('/api/console/tools', { signal });
    tools.replaceChildren(...(res.tools.length ? res.tools.map((t) => h('details', { class: 'tool', 'data-tool': t.name },
      h('summary', {}, h('span', { class: 'mono' }, t.name), h('span', { class: 'muted' }, ' saved ' + fmtTime(t.saved_at))),
      scroller('Source of ' + t.name, h('pre', { class: 'code' }, h('code', { class: 'hl' }, highlight(t.source, 'python').map(([c, x]) => (c ? h('span', { class: c }, x) : x)))))))
      : [h('p', {}, 'No saved tools: save_tool(fn) in a job saves one.')]));
  };
  await Promise.all([render(), renderTools()]);
  every(5000, render, signal);
}
