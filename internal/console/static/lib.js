// Shared helpers: DOM building (text only: data never becomes HTML), the
// API client with the caller's token, and the events stream.
const TOKEN = 'mcpexec.token';
const NS = 'mcpexec.ns';

export const store = {
  token: () => sessionStorage.getItem(TOKEN) || '',
  setToken: (t) => (t ? sessionStorage.setItem(TOKEN, t) : sessionStorage.removeItem(TOKEN)),
  ns: () => sessionStorage.getItem(NS) || '',
  setNs: (n) => (n ? sessionStorage.setItem(NS, n) : sessionStorage.removeItem(NS)),
  admin: false,
};

// h builds an element: h('a', {href: '#/x', class: 'y'}, 'text', child...).
export function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const k of kids.flat(Infinity)) {
    if (k === undefined || k === null || k === false) continue;
    el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return el;
}

export function headers(extra) {
  const hs = { Accept: 'application/json', ...(extra || {}) };
  if (store.token()) hs.Authorization = 'Bearer ' + store.token();
  if (store.admin && store.ns()) hs['X-Mcpexec-Namespace'] = store.ns();
  return hs;
}

export class APIError extends Error {
  constructor(status, data, fallback) {
    super((data && data.error && data.error.message) || fallback);
    this.status = status;
    this.data = data;
  }
}

// blobURL fetches a file with the caller's token and returns an object URL of
// its bytes (images and downloads cannot send the token themselves).
export async function blobURL(path, signal) {
  const r = await fetch(path, { headers: headers({ Accept: '*/*' }), signal });
  if (!r.ok) throw new APIError(r.status, null, r.status + ' ' + r.statusText);
  return URL.createObjectURL(await r.blob());
}

// api calls the front-end's JSON API; it throws APIError on a failed answer.
export async function api(path, opts = {}) {
  const init = { method: opts.method || 'GET', headers: headers(), signal: opts.signal };
  if (opts.body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(opts.body);
  }
  const r = await fetch(path, init);
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  if (!r.ok) {
    if (r.status === 401) document.dispatchEvent(new CustomEvent('mcpexec:unauthorized'));
    throw new APIError(r.status, data, r.status + ' ' + r.statusText);
  }
  return data;
}

// follow reads GET /api/events (Server-Sent Events, read with fetch so the
// token goes in a header) until signal aborts, reconnecting with the last
// event id; onEvent gets each event's data, onState true/false for live.
export function follow(query, onEvent, onState, signal) {
  return stream('/api/events', query, onEvent, onState, signal);
}

// stream reads the Server-Sent Events of path (see follow).
export async function stream(path, query, onEvent, onState, signal) {
  let last = '';
  while (!signal.aborted) {
    try {
      const hs = headers({ Accept: 'text/event-stream' });
      if (last) hs['Last-Event-ID'] = last;
      const r = await fetch(path + (query ? '?' + query : ''), { headers: hs, signal });
      if (!r.ok) throw new Error('events: ' + r.status);
      onState(true);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        if (buf.length > 1 << 20) buf = buf.slice(-4096); // a broken stream never grows us without bound
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let data = '', id = '';
          for (const line of block.split('\n')) {
            if (line.startsWith('data: ')) data += line.slice(6);
            else if (line.startsWith('id: ')) id = line.slice(4);
          }
          if (id) last = id;
          if (data) {
            try { onEvent(JSON.parse(data)); } catch { /* not an event: ignore */ }
          }
        }
      }
    } catch {
      if (signal.aborted) return;
    }
    onState(false);
    await new Promise((res) => setTimeout(res, 1500));
  }
}

export function fmtTime(s) {
  if (!s) return '';
  const d = new Date(s);
  if (isNaN(d)) return '';
  return d.toLocaleString(undefined, { hour12: false });
}

export function fmtDur(ms) {
  if (ms === undefined || ms === null) return '';
  return ms >= 1000 ? (ms / 1000).toFixed(2) + ' s' : Math.round(ms * 10) / 10 + ' ms';
}

export function badge(status) {
  return h('span', { class: 'badge st-' + String(status).replace(/[^a-z_]/g, '') }, status);
}

export function scroller(label, ...kids) {
  return h('div', { class: 'scroll', tabindex: '0', role: 'region', 'aria-label': label }, ...kids);
}

export function notice(text, kind) {
  return h('p', { class: 'notice ' + (kind || ''), role: kind === 'error' ? 'alert' : 'status' }, text);
}

export const TERMINAL = new Set(['success', 'error', 'timeout', 'cancelled', 'worker_lost', 'rejected', 'infra_error', 'skipped']);
export const STATUSES = ['waiting', 'queued', 'running', ...TERMINAL];
