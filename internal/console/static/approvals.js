// Approvals: the header's live count of the namespace's calls waiting for
// a person, and the page that answers them.
import { h, api, stream, fmtTime, scroller, notice } from './lib.js';
import { highlight } from './hl.js';

// MAX_ARGS and MAX_CODE cap what a card shows of a call's arguments and of
// its job's code (the API caps the arguments at 4 KiB already).
const MAX_ARGS = 4096;
const MAX_CODE = 20000;
const MAX_GRANT_MINUTES = 120;

// followApprovals follows the namespace's approval events until signal
// aborts; onReset gets the calls waiting whenever the stream (re)connects
// (listed once it is open, so nothing falls between), then onEvent each
// event. An answer seen before the list that still names the call wins.
function followApprovals(onReset, onEvent, onState, signal) {
  const answered = new Set();
  return stream('/api/approvals/events', '', (e) => {
    if (e.kind === 'approval_answered') answered.add(e.id);
    onEvent(e);
  }, async (on) => {
    onState(on);
    if (!on) return;
    try {
      const res = await api('/api/approvals', { signal });
      onReset(res.approvals.filter((a) => !answered.has(a.id)));
    } catch { /* the stream reconnects and lists again */ }
  }, signal);
}

let countAbort = new AbortController();

// startCount keeps the header's count of pending approvals live; call it
// again after signing in or changing namespace.
export function startCount() {
  countAbort.abort();
  countAbort = new AbortController();
  const el = document.getElementById('approvals-count');
  if (!el) return;
  const ids = new Set();
  const paint = () => {
    el.textContent = String(ids.size);
    el.className = 'count' + (ids.size ? ' some' : '');
    el.setAttribute('aria-label', ids.size + ' waiting');
  };
  paint();
  followApprovals((list) => { ids.clear(); for (const a of list) ids.add(a.id); paint(); }, (e) => {
    if (e.kind === 'approval_asked') ids.add(e.id);
    else ids.delete(e.id);
    paint();
  }, () => {}, countAbort.signal);
}

export function stopCount() {
  countAbort.abort();
  const el = document.getElementById('approvals-count');
  if (el) el.textContent = '';
}

// pretty is a call's arguments as indented JSON, capped.
function pretty(a) {
  let text = typeof a.arguments === 'string' && a.arguments_truncated ? a.arguments : JSON.stringify(a.arguments, null, 2);
  if (text === undefined) text = '';
  const cut = text.length > MAX_ARGS;
  return { text: cut ? text.slice(0, MAX_ARGS) + '…' : text, cut: cut || a.arguments_truncated };
}

export async function approvalsPage(show, signal) {
  const live = h('span', { id: 'approvals-live', class: 'live off', role: 'status' }, 'connecting…');
  const list = h('div', { id: 'approvals' });
  const empty = h('p', { id: 'approvals-empty', class: 'muted' }, 'No call is waiting for approval.');
  const msg = h('div', { id: 'approvals-msg', 'aria-live': 'polite' });
  const grants = h('section', { id: 'grants', 'aria-labelledby': 'h-grants' });
  show('Approvals', h('div', { class: 'bar' }, h('span', { class: 'muted' }, 'Calls of this namespace\'s jobs that wait for a person (tool rules saying "ask").'), live),
    msg, list, empty, grants);
  const cards = new Map();
  const codes = new Map(); // job id → promise of its code
  const codeOf = (job) => {
    if (!codes.has(job)) codes.set(job, api('/api/jobs/' + encodeURIComponent(job), { signal }).then((r) => r.job));
    return codes.get(job);
  };
  const tidy = () => { empty.hidden = cards.size > 0; };

  const renderGrants = async () => {
    const res = await api('/api/approvals/grants', { signal });
    const rows = res.grants.map((g) => {
      const b = h('button', { type: 'button', class: 'revoke', 'data-grant': g.id, onclick: async () => {
        b.disabled = true;
        try {
          await api('/api/approvals/grants/' + encodeURIComponent(g.id), { method: 'DELETE', signal });
          await renderGrants();
        } catch (e) {
          msg.replaceChildren(notice(e.message, 'error'));
          b.disabled = false;
        }
      } }, 'Revoke');
      return h('tr', { 'data-grant': g.id, 'data-scope': g.scope },
        h('td', { class: 'mono' }, g.server + '/' + g.tool),
        h('td', {}, g.scope === 'job' ? h('span', {}, 'job ', h('a', { href: '#/job/' + encodeURIComponent(g.job_id), class: 'mono' }, g.job_id)) : 'namespace'),
        h('td', {}, g.granted_by + (g.reason ? ': ' + g.reason : '')), h('td', {}, fmtTime(g.expires_at)), h('td', {}, b));
    });
    grants.replaceChildren(h('h2', { id: 'h-grants' }, 'Grants in force'),
      rows.length ? scroller('Grants table', h('table', { id: 'grants-table' }, h('caption', { class: 'sr' }, 'Grants'),
        h('thead', {}, h('tr', {}, ['Tool', 'For', 'Granted by', 'Until', ''].map((c) => h('th', { scope: 'col' }, c)))), h('tbody', {}, rows)))
        : h('p', { class: 'muted' }, 'None: every "ask" call is asked.'));
  };

  const card = (a) => {
    const args = pretty(a);
    const reason = h('input', { class: 'reason', id: 'reason-' + a.id, maxlength: 1000, placeholder: 'optional', spellcheck: 'true' });
    const minutes = h('input', { class: 'minutes', id: 'minutes-' + a.id, type: 'number', min: 1, max: MAX_GRANT_MINUTES, value: 30, disabled: true });
    const scope = h('select', { class: 'scope', id: 'scope-' + a.id, onchange: () => { minutes.disabled = scope.value !== 'namespace'; } },
      h('option', { value: 'call' }, 'This call only'),
      h('option', { value: 'job' }, 'Also this job\'s later calls of ' + a.server + '/' + a.tool),
      h('option', { value: 'namespace' }, 'Also every job\'s calls of ' + a.server + '/' + a.tool + ' for a while'));
    const out = h('div', { class: 'card-msg', 'aria-live': 'polite' });
    const answer = async (decision) => {
      const body = { decision };
      if (reason.value.trim()) body.reason = reason.value.trim();
      if (decision === 'approve' && scope.value !== 'call') {
        body.scope = scope.value;
        if (scope.value === 'namespace') {
          const n = Number(minutes.value);
          if (!Number.isInteger(n) || n < 1 || n > MAX_GRANT_MINUTES) {
            out.replaceChildren(notice('Minutes: a whole number from 1 to ' + MAX_GRANT_MINUTES + '.', 'error'));
            return;
          }
          body.minutes = n;
        }
      }
      for (const b of el.querySelectorAll('button')) b.disabled = true;
      try {
        const res = await api('/api/approvals/' + encodeURIComponent(a.id), { method: 'POST', body, signal });
        drop(a.id);
        const what = (decision === 'approve' ? 'Approved ' : 'Denied ') + a.server + '/' + a.tool + ' for job ' + a.job_id;
        msg.replaceChildren(notice(what + (res.grant ? ', and granted its later calls (' + res.grant.scope + ') until ' + fmtTime(res.grant.expires_at) : '') + '.', ''));
        if (res.grant) renderGrants().catch(() => {});
      } catch (e) {
        out.replaceChildren(notice(e.message, 'error'));
        if (e.status === 409 || e.status === 404) { drop(a.id, 3000); return; }
        for (const b of el.querySelectorAll('button')) b.disabled = false;
      }
    };
    const approve = h('button', { type: 'button', class: 'approve', onclick: () => answer('approve') }, 'Approve');
    const deny = h('button', { type: 'button', class: 'deny danger', onclick: () => answer('deny') }, 'Deny');
    const code = h('div', { class: 'job-code' }, h('p', { class: 'muted' }, 'Loading the job\'s code…'));
    codeOf(a.job_id).then((j) => {
      const text = (j.code || '').length > MAX_CODE ? j.code.slice(0, MAX_CODE) + '\n…' : (j.code || '');
      code.replaceChildren(h('pre', { class: 'code', tabindex: '0', role: 'region', 'aria-label': 'Code of job ' + a.job_id },
        h('code', { class: 'hl' }, highlight(text, j.language || 'python').map(([c, s]) => (c ? h('span', { class: c }, s) : s)))));
    }).catch((e) => code.replaceChildren(notice('The job\'s code: ' + e.message, 'error')));
    const el = h('article', { class: 'approval', 'data-approval': a.id, 'aria-labelledby': 'h-ap-' + a.id },
      h('h2', { id: 'h-ap-' + a.id }, h('span', { class: 'mono tool' }, a.server + '/' + a.tool), ' for job ',
        h('a', { href: '#/job/' + encodeURIComponent(a.job_id), class: 'mono' }, a.job_id)),
      h('dl', { class: 'facts' }, h('dt', {}, 'Rule'), h('dd', { class: 'mono' }, a.rule), h('dt', {}, 'Asked'), h('dd', {}, fmtTime(a.asked_at)),
        h('dt', {}, 'Denied unless answered by'), h('dd', {}, fmtTime(a.expires_at)), h('dt', {}, 'Id'), h('dd', { class: 'mono' }, a.id)),
      h('h3', {}, 'Arguments', args.cut ? h('span', { class: 'badge st-error cut' }, 'cut: ' + a.arguments_bytes + ' bytes, SHA-256 ' + (a.arguments_sha256 || '').slice(0, 16) + '…') : null),
      h('pre', { class: 'out args', tabindex: '0', role: 'region', 'aria-label': 'Arguments of ' + a.server + '/' + a.tool }, args.text),
      h('h3', {}, 'The job\'s code'), code,
      h('div', { class: 'answer' },
        h('div', { class: 'field' }, h('label', { for: 'reason-' + a.id }, 'Reason'), reason),
        h('div', { class: 'field' }, h('label', { for: 'scope-' + a.id }, 'Approve for'), scope),
        h('div', { class: 'field' }, h('label', { for: 'minutes-' + a.id }, 'Minutes'), minutes),
        approve, deny),
      out);
    return el;
  };
  const add = (a) => {
    if (cards.has(a.id)) return;
    const el = card(a);
    cards.set(a.id, el);
    list.append(el);
    tidy();
  };
  const drop = (id, after) => {
    const el = cards.get(id);
    if (!el) return;
    const go = () => { el.remove(); cards.delete(id); tidy(); };
    if (after) setTimeout(go, after); else go();
  };
  tidy();
  await renderGrants();
  followApprovals((listed) => {
    const keep = new Set(listed.map((a) => a.id));
    for (const id of [...cards.keys()]) if (!keep.has(id)) drop(id);
    for (const a of listed) add(a);
  }, (e) => {
    if (e.kind === 'approval_asked') add(e);
    else {
      const el = cards.get(e.id);
      if (el && !el.querySelector('button:disabled')) msg.replaceChildren(notice(e.server + '/' + e.tool + ' for job ' + e.job_id + ' is ' + e.state.replace('_', ' ') + (e.decided_by ? ' by ' + e.decided_by : '') + '.', ''));
      drop(e.id);
      if (e.scope) renderGrants().catch(() => {});
    }
  }, (on) => { live.textContent = on ? 'live' : 'reconnecting…'; live.className = 'live ' + (on ? 'on' : 'off'); }, signal);
}
