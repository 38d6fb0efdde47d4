// The console's router, sign-in and the jobs pages.
import { h, api, blobURL, follow, store, fmtTime, fmtDur, badge, scroller, notice, TERMINAL, STATUSES } from './lib.js';
import { highlight } from './hl.js';
import { fleetPage, memoryPage, chartsPage, sessionsPage } from './pages.js';
import { approvalsPage, startCount, stopCount } from './approvals.js';

const main = document.getElementById('main');
let pageAbort = new AbortController();

function route() {
  pageAbort.abort();
  pageAbort = new AbortController();
  const signal = pageAbort.signal;
  const [path, query] = (location.hash.slice(1) || '/jobs').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  const page = parts[0] || 'jobs';
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.page === page || (page === 'job' && a.dataset.page === 'jobs')) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.replaceChildren();
  const show = (title, ...kids) => {
    document.title = title + ' · mcpexec';
    main.replaceChildren(h('h1', {}, title), ...kids.filter((k) => k !== null && k !== undefined && k !== false));
  };
  const pages = {
    jobs: () => jobsPage(show, params, signal),
    job: () => jobPage(show, decodeURIComponent(parts[1] || ''), signal),
    fleet: () => fleetPage(show, signal),
    memory: () => memoryPage(show, params, signal),
    sessions: () => sessionsPage(show, signal),
    charts: () => chartsPage(show, signal),
    approvals: () => approvalsPage(show, signal),
  };
  (pages[page] || pages.jobs)().catch((e) => {
    if (signal.aborted) return;
    if (e.status === 401) return; // the sign-in form is shown
    main.append(notice(e.message, 'error'));
  });
}

// Sign-in: the token lives in this tab's session storage only.
function signIn(message) {
  pageAbort.abort();
  stopCount();
  document.title = 'Sign in · mcpexec';
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false' });
  const form = h('form', { class: 'signin', onsubmit: (e) => { e.preventDefault(); store.setToken(input.value.trim()); start(); } },
    h('label', { for: 'token' }, 'Bearer token'), input, h('button', { type: 'submit' }, 'Sign in'));
  main.replaceChildren(...[h('h1', {}, 'Sign in'), message ? notice(message, 'error') : null,
    h('p', {}, 'Use a token of the front-end\'s tokens file (--auth-tokens-file). It is kept in this tab only.'), form].filter(Boolean));
  document.getElementById('who').replaceChildren();
  input.focus();
}

async function start() {
  let me;
  try {
    me = await api('/api/console/whoami');
  } catch (e) {
    signIn(e.status === 401 ? (store.token() ? 'That token was refused.' : '') : e.message);
    return;
  }
  store.admin = me.admin;
  const who = document.getElementById('who');
  const kids = [];
  if (me.admin) {
    const list = h('datalist', { id: 'ns-list' }, (me.namespaces || []).map((n) => h('option', { value: n })));
    const input = h('input', { id: 'ns', value: store.ns() || me.namespace, list: 'ns-list', size: 10, maxlength: 128, pattern: '[A-Za-z0-9._\\-]{1,128}' });
    kids.push(h('form', { class: 'nsform', onsubmit: (e) => { e.preventDefault(); store.setNs(input.value.trim()); startCount(); route(); } },
      h('label', { for: 'ns' }, 'Namespace (admin)'), input, list, h('button', { type: 'submit' }, 'View')));
  } else {
    kids.push(h('span', {}, 'Namespace ', h('strong', { id: 'ns-name' }, me.namespace)));
  }
  if (store.token()) kids.push(h('button', { type: 'button', class: 'link', onclick: () => { store.setToken(''); store.setNs(''); signIn(''); } }, 'Sign out'));
  who.replaceChildren(...kids);
  startCount();
  route();
}

document.addEventListener('mcpexec:unauthorized', () => signIn(store.token() ? 'The token was refused.' : ''));
window.addEventListener('hashchange', () => { route(); main.focus({ preventScroll: true }); });
start();

// ---- Jobs ----

const PAGE = 50;

async function jobsPage(show, params, signal) {
  const q = Object.fromEntries(['status', 'label', 'prefix', 'workflow'].map((k) => [k, (params.get(k) || '').slice(0, 200)]));
  const field = (name, label, input) => h('div', { class: 'field' }, h('label', { for: 'f-' + name }, label), input);
  const status = h('select', { id: 'f-status', name: 'status' }, h('option', { value: '' }, 'any'), STATUSES.map((s) => h('option', { value: s, selected: s === q.status }, s)));
  const text = (name, ph) => h('input', { id: 'f-' + name, name, value: q[name], placeholder: ph, maxlength: 200, spellcheck: 'false' });
  const filters = h('form', { class: 'filters', 'aria-label': 'Filter jobs', onsubmit: (e) => {
    e.preventDefault();
    const fd = new URLSearchParams();
    for (const [k, v] of new FormData(e.target)) if (v) fd.set(k, v);
    location.hash = '#/jobs' + (fd.toString() ? '?' + fd : '');
  } },
  field('status', 'Status', status), field('label', 'Label', text('label', 'key=value')), field('prefix', 'Id prefix', text('prefix', '')),
  field('workflow', 'Workflow', text('workflow', '')), h('button', { type: 'submit' }, 'Filter'));
  const idInput = h('input', { id: 'find-id', maxlength: 128, spellcheck: 'false', placeholder: 'job id' });
  const find = h('form', { class: 'find', role: 'search', onsubmit: (e) => { e.preventDefault(); if (idInput.value.trim()) location.hash = '#/job/' + encodeURIComponent(idInput.value.trim()); } },
    h('label', { for: 'find-id' }, 'Open job by id'), idInput, h('button', { type: 'submit' }, 'Open'));
  const live = h('span', { id: 'live', class: 'live off', role: 'status' }, 'connecting…');
  const tbody = h('tbody', { id: 'jobs-body' });
  const table = h('table', { id: 'jobs' }, h('caption', { class: 'sr' }, 'Jobs'),
    h('thead', {}, h('tr', {}, ['Id', 'Status', 'Attempt', 'Worker', 'Submitted', 'Duration', 'Labels'].map((c) => h('th', { scope: 'col' }, c)))), tbody);
  const more = h('button', { type: 'button', id: 'more', hidden: true }, 'Load more');
  const count = h('p', { id: 'count', class: 'muted' });
  show('Jobs', h('div', { class: 'bar' }, find, live), filters, count, scroller('Jobs table', table), more);

  const rows = new Map();
  const row = (rec) => {
    const j = rec.job || {};
    const labels = Object.entries(j.labels || {}).map(([k, v]) => h('span', { class: 'tag' }, k + '=' + v));
    const dur = rec.result ? fmtDur(rec.result.duration_ms) : '';
    return h('tr', { 'data-id': j.id },
      h('td', {}, h('a', { href: '#/job/' + encodeURIComponent(j.id), class: 'mono' }, j.id)),
      h('td', { class: 'status' }, badge(rec.status)), h('td', { class: 'attempt' }, rec.attempt || ''),
      h('td', { class: 'worker' }, rec.worker || ''), h('td', {}, fmtTime(j.submitted_at || rec.created_at)),
      h('td', {}, dur), h('td', {}, labels));
  };
  const put = (rec, top) => {
    const tr = row(rec);
    const old = rows.get(rec.job.id);
    if (old) old.replaceWith(tr);
    else if (top) tbody.prepend(tr);
    else tbody.append(tr);
    rows.set(rec.job.id, tr);
  };
  const listQuery = () => {
    const p = new URLSearchParams({ limit: String(PAGE), order: 'newest' });
    if (q.status) p.set('status', q.status);
    if (q.prefix) p.set('prefix', q.prefix);
    if (q.label) p.append('label', q.label);
    if (q.workflow) p.append('label', 'workflow=' + q.workflow);
    return p;
  };
  let cursor = '';
  const load = async () => {
    const p = listQuery();
    if (cursor) p.set('cursor', cursor);
    const res = await api('/api/jobs?' + p, { signal });
    for (const rec of res.jobs) put(rec, false);
    cursor = res.next || '';
    more.hidden = !cursor;
    count.textContent = rows.size + ' job' + (rows.size === 1 ? '' : 's') + ' shown' + (cursor ? ' (more below)' : '');
  };
  more.addEventListener('click', () => load().catch((e) => main.append(notice(e.message, 'error'))));
  await load();

  const ev = new URLSearchParams();
  if (q.prefix) ev.set('prefix', q.prefix);
  if (q.label) ev.append('label', q.label);
  if (q.workflow) ev.set('workflow', q.workflow);
  follow(ev.toString(), (e) => {
    const tr = rows.get(e.job);
    if (tr) {
      tr.querySelector('.status').replaceChildren(badge(e.status));
      if (e.worker) tr.querySelector('.worker').textContent = e.worker;
      if (e.attempt) tr.querySelector('.attempt').textContent = e.attempt;
      return;
    }
    if (e.kind !== 'submitted' || (q.status && e.status !== q.status)) return;
    put({ job: { id: e.job, labels: e.labels, submitted_at: e.at }, status: e.status }, true);
    count.textContent = rows.size + ' jobs shown';
  }, (on) => { live.textContent = on ? 'live' : 'reconnecting…'; live.className = 'live ' + (on ? 'on' : 'off'); }, signal);
}

// ---- One job ----

async function jobPage(show, id, signal) {
  if (!/^[A-Za-z0-9_-]{1,128}$/.test(id)) {
    show('Job', notice('Not a job id: ids are 1-128 letters, digits, - or _.', 'error'));
    return;
  }
  const path = '/api/jobs/' + encodeURIComponent(id);
  const render = async () => {
    const t = await api('/api/console/jobs/' + encodeURIComponent(id) + '/timeline', { signal });
    const rec = t.job;
    const j = rec.job;
    const res = rec.result;
    const msg = h('div', { id: 'actions-msg', 'aria-live': 'polite' });
    const act = async (what, btn) => {
      btn.disabled = true;
      try {
        const out = await api(path + '/' + what, { method: 'POST', body: what === 'retry' ? {} : undefined, signal });
        if (what === 'retry') location.hash = '#/job/' + encodeURIComponent(out.job.id);
        else await render();
      } catch (e) {
        msg.replaceChildren(notice(e.message, 'error'));
        btn.disabled = false;
      }
    };
    const buttons = [];
    if (!TERMINAL.has(rec.status)) {
      const b = h('button', { type: 'button', id: 'cancel', class: 'danger', onclick: () => act('cancel', b) }, 'Cancel job');
      buttons.push(b);
    } else {
      const b = h('button', { type: 'button', id: 'retry', onclick: () => act('retry', b) }, rec.status === 'success' ? 'Run again' : 'Retry');
      buttons.push(b);
    }
    const curl = curlOf(j);
    const curlBox = h('pre', { id: 'curl', class: 'code', hidden: true }, curl);
    buttons.push(h('button', { type: 'button', id: 'copy-curl', onclick: async () => {
      curlBox.hidden = false;
      try { await navigator.clipboard.writeText(curl); msg.replaceChildren(notice('Copied the curl command.', '')); } catch { msg.replaceChildren(notice('Select the command below to copy it.', '')); }
    } }, 'Copy as curl'));
    const dl = (pairs) => h('dl', { class: 'facts' }, pairs.filter(([, v]) => v !== '' && v !== undefined && v !== null).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
    const code = h('code', { class: 'hl' }, highlight(j.code || '', j.language || 'python').map(([c, s]) => (c ? h('span', { class: c }, s) : s)));
    const out = (name, text, cut) => h('section', { 'aria-labelledby': 'h-' + name },
      h('h2', { id: 'h-' + name }, name, cut ? h('span', { class: 'badge st-error cut' }, 'cut at the cap') : null),
      scroller(name, h('pre', { id: name, class: 'out' }, text || '')));
    const tl = h('ol', { id: 'timeline', class: 'timeline' }, t.entries.map((e) => {
      const t0 = new Date(t.entries[0].at).getTime();
      const off = '+' + fmtDur(new Date(e.at).getTime() - t0);
      return h('li', { class: 'ev ' + e.kind + (e.outcome === 'error' ? ' bad' : ''), 'data-kind': e.kind },
        h('span', { class: 'off mono' }, off), ' ', h('strong', {}, e.title), e.detail ? h('span', { class: 'muted' }, ' ' + e.detail) : null,
        e.attempt > 1 ? h('span', { class: 'tag' }, 'attempt ' + e.attempt) : null);
    }));
    show('Job ' + j.id,
      h('p', {}, h('a', { href: '#/jobs' }, '← all jobs')),
      h('div', { class: 'bar' }, badge(rec.status), ...buttons), msg, curlBox,
      dl([['Status', rec.status], ['Attempts', (rec.attempt || 0) + ' of ' + j.max_attempts], ['Worker', rec.worker || ''],
        ['Trace id', h('span', { class: 'mono', id: 'trace-id' }, rec.trace_id || '')], ['Language', j.language || 'python'],
        ['Submitted', fmtTime(j.submitted_at)], ['Started', fmtTime(rec.started_at)], ['Finished', fmtTime(rec.finished_at)],
        ['Servers', (j.servers || []).join(', ')], ['Labels', Object.entries(j.labels || {}).map(([k, v]) => k + '=' + v).join(', ')],
        ['Re-run of', j.retry_of ? h('a', { href: '#/job/' + encodeURIComponent(j.retry_of) }, j.retry_of) : '']]),
      h('section', { 'aria-labelledby': 'h-code' }, h('h2', { id: 'h-code' }, 'Code'), scroller('Code', h('pre', { class: 'code' }, code))),
      res ? h('section', { 'aria-labelledby': 'h-result' }, h('h2', { id: 'h-result' }, 'Result'),
        dl([['Status', res.status], ['Exit code', res.exit_code], ['Duration', fmtDur(res.duration_ms)], ['Error', res.error || ''],
          ['Worker', res.worker || ''], ['Attempt', res.attempt || '']])) : null,
      res ? out('stdout', res.stdout, res.stdout_truncated) : null,
      res ? out('stderr', res.stderr, res.stderr_truncated) : null,
      res && ((res.files && res.files.length) || (res.notes && res.notes.length)) ? filesSection(path, res, signal) : null,
      h('section', { 'aria-labelledby': 'h-timeline' }, h('h2', { id: 'h-timeline' }, 'Timeline'), tl, t.note ? h('p', { class: 'muted' }, t.note) : null));
    return rec;
  };
  const rec = await render();
  if (TERMINAL.has(rec.status)) return;
  let pending = null;
  follow('prefix=' + encodeURIComponent(id), (e) => {
    if (e.job !== id || pending) return;
    // A moment later: the spans of the step end just after its event.
    pending = setTimeout(() => { pending = null; render().catch(() => {}); }, 300);
  }, () => {}, signal);
}

const PICTURES = new Set(['image/png', 'image/jpeg', 'image/gif', 'image/webp']);

// filesSection shows what a job wrote under /workspace/out: its pictures,
// and a download for every file (fetched with the token: links cannot send it).
function filesSection(path, res, signal) {
  const fileURL = (f) => path + '/files/' + f.name.split('/').map(encodeURIComponent).join('/');
  const figs = [];
  const items = (res.files || []).map((f) => {
    if (PICTURES.has(f.mimeType)) {
      const img = h('img', { alt: f.name, 'data-file': f.name });
      figs.push(h('figure', {}, img, h('figcaption', {}, f.name)));
      blobURL(fileURL(f), signal).then((u) => { img.src = u; }).catch((e) => { img.replaceWith(notice(f.name + ': ' + e.message, 'error')); });
    }
    const b = h('button', { type: 'button', class: 'link', 'data-file': f.name, onclick: async () => {
      b.disabled = true;
      try {
        const a = h('a', { href: await blobURL(fileURL(f), signal), download: f.name.split('/').pop() });
        document.body.append(a);
        a.click();
        a.remove();
      } catch (e) {
        b.after(notice(e.message, 'error'));
      }
      b.disabled = false;
    } }, 'Download ' + f.name);
    return h('li', {}, b, h('span', { class: 'muted' }, ' ' + f.size + ' bytes, ' + f.mimeType));
  });
  return h('section', { 'aria-labelledby': 'h-files', id: 'files' }, h('h2', { id: 'h-files' }, 'Files'),
    figs.length ? h('div', { class: 'figures' }, figs) : null,
    items.length ? h('ul', { class: 'files' }, items) : null,
    res.notes && res.notes.length ? h('ul', { class: 'notes muted' }, res.notes.map((n) => h('li', {}, n))) : null);
}

function curlOf(j) {
  const body = { code: j.code };
  if (j.language && j.language !== 'python') body.language = j.language;
  if (j.servers && j.servers.length) body.servers = j.servers;
  if (j.timeout) body.timeout = j.timeout;
  if (j.labels && Object.keys(j.labels).length) body.labels = j.labels;
  const quote = (s) => "'" + s.replace(/'/g, "'\\''") + "'";
  return 'curl -sS -X POST ' + quote(location.origin + '/api/jobs') + ' -H "Authorization: Bearer $MCPEXEC_TOKEN" -H \'Content-Type: application/json\' --data ' + quote(JSON.stringify(body));
}
