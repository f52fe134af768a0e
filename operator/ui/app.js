// The Fleet web view (docs/behaviour.md#web-view): read-only pages over the controller's JSON API, built with
// DOM calls (never innerHTML with data), refreshed every few seconds in place. The admin
// token lives in sessionStorage: this tab only, never in a URL.
'use strict';
(() => {
  const base = location.pathname.replace(/\/ui\/?$/, ''); // '' or the proxy's prefix, e.g. '/fleet'
  const main = document.getElementById('main');
  const TOKEN = 'fleet.token';
  const REFRESH_MS = 5000;
  const PAGE = 50;
  let timer = null;
  let render = null; // the current page's render function
  const cursors = {}; // list page → stack of cursors (for Previous)

  // ---- helpers ----------------------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  const link = (href, text) => h('a', { href }, text);
  const enc = encodeURIComponent;
  const dash = (v) => (v === null || v === undefined || v === '' ? '–' : v);
  function badge(text, tone) {
    return h('span', { class: 'badge ' + tone }, text);
  }
  const statusTone = { online: 'ok', offline: 'bad', ok: 'ok', degraded: 'warn', running: 'ok', placed: 'ok',
    pending: 'warn', waiting_for_node: 'bad', crash_looping: 'bad', crashloop: 'bad', node_unavailable: 'bad',
    stopped: 'muted', starting: 'warn', draining: 'warn', schedulable: 'ok', cordoned: 'warn', drained: 'warn' };
  const tone = (s) => statusTone[String(s).split(' ')[0]] || 'muted';
  function scheduling(n) {
    if (n.drain) return n.drain.remaining === 0 ? 'drained' : `draining (${n.drain.remaining} left)`;
    return n.schedulable === false ? 'cordoned' : 'schedulable';
  }
  function ago(ts) {
    const s = Math.max(0, Math.round((Date.now() - Date.parse(ts)) / 1000));
    if (!isFinite(s)) return '?';
    if (s < 120) return s + 's ago';
    if (s < 7200) return Math.floor(s / 60) + 'm ago';
    if (s < 172800) return Math.floor(s / 3600) + 'h ago';
    return Math.floor(s / 86400) + 'd ago';
  }
  // A time ahead: the browser's local date and time, and how far off it is.
  function ahead(ts) {
    const ms = Date.parse(ts);
    if (!isFinite(ms)) return String(ts);
    const s = Math.max(0, Math.round((ms - Date.now()) / 1000));
    const left = s < 120 ? s + 's' : s < 7200 ? Math.floor(s / 60) + 'm' : s < 172800 ? Math.floor(s / 3600) + 'h'
      : Math.floor(s / 86400) + 'd';
    return `${new Date(ms).toLocaleString()} (in ${left})`;
  }
  // A replica's busy state (docs/behaviour.md#busy-replicas): busy until a time, idle while
  // it runs without a lease, nothing to say otherwise.
  function busy(r) {
    if (r.busyUntil) return h('span', { class: 'badge warn', title: r.busyUntil }, 'busy until ' + ahead(r.busyUntil));
    return r.state === 'running' ? 'idle' : '–';
  }
  function table(caption, head, rows, numeric = []) {
    return h('table', {},
      h('caption', {}, caption),
      h('thead', {}, h('tr', {}, head.map((c, i) => h('th', { scope: 'col', class: numeric.includes(i) ? 'num' : null }, c)))),
      h('tbody', {}, rows.length ? rows.map((r) => h('tr', {}, r.map((c, i) => h('td', { class: numeric.includes(i) ? 'num' : null }, c))))
        : h('tr', {}, h('td', { colspan: head.length, class: 'muted' }, 'none'))));
  }

  class ApiError extends Error {}
  async function get(path) {
    const r = await fetch(base + path, { headers: { Authorization: 'Bearer ' + sessionStorage.getItem(TOKEN) } });
    const body = await r.json().catch(() => null);
    if (!r.ok) {
      const e = new ApiError(body && body.message ? `${body.message} (${body.error})` : `HTTP ${r.status}`);
      e.status = r.status;
      throw e;
    }
    return body;
  }

  // ---- pages ------------------------------------------------------------------------------
  async function overview() {
    const s = await get('/api/v1/summary');
    const n = s.nodes, r = s.replicas;
    const card = (title, pairs) => h('section', { class: 'card', 'aria-label': title },
      h('h2', {}, title), h('dl', {}, pairs.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])));
    return [
      h('h1', {}, 'Overview'),
      h('div', { class: 'cards' },
        card('Nodes', [['total', n.total], ['online', n.online], ['offline', n.offline], ['degraded', n.degraded],
          ['cordoned', n.cordoned], ['draining', n.draining]]),
        card('Replicas', [['placed', r.placed], ['pending', r.pending], ['stopped agents', r.stopped]]),
        card('Pending by reason', Object.entries(s.pendingByReason).map(([k, v]) => [k, v]).concat(
          Object.keys(s.pendingByReason).length ? [] : [['none', '–']]))),
      table(`Waiting agents (${s.waiting.length}${s.waitingTruncated ? '+' : ''})`, ['Agent', 'Replicas waiting', 'Reason'],
        s.waiting.map((w) => [link('#/agents/' + enc(w.agentKey), w.agentKey), w.replicas, badge(w.reason, 'bad')]), [1]),
    ];
  }

  function pager(key, next, reload) {
    const stack = cursors[key] || (cursors[key] = []);
    return h('div', { class: 'pager' },
      h('button', { type: 'button', disabled: stack.length === 0, onclick: () => { stack.pop(); reload(); } }, 'Previous page'),
      h('span', { class: 'muted' }, `page ${stack.length + 1}`),
      h('button', { type: 'button', disabled: !next, onclick: () => { stack.push(next); reload(); } }, 'Next page'));
  }
  const current = (key) => { const s = cursors[key] || []; return s.length ? '&cursor=' + enc(s[s.length - 1]) : ''; };

  async function nodes() {
    const page = await get(`/api/v1/nodes?limit=${PAGE}${current('nodes')}`);
    const rows = page.items.map((n) => [
      link('#/nodes/' + enc(n.name), n.name), badge(n.status, tone(n.status)), badge(n.health, tone(n.health)),
      badge(scheduling(n), tone(scheduling(n))), `${n.slotsUsed}/${n.capacity.slots}`, dash(n.version), ago(n.lastSeenAt)]);
    return [h('h1', {}, 'Nodes'),
      table('Nodes by name', ['Name', 'Status', 'Health', 'Scheduling', 'Slots used/total', 'Version', 'Last seen'], rows, [4]),
      pager('nodes', page.nextCursor, refresh)];
  }

  async function node(name) {
    const [d, ev] = await Promise.all([get('/api/v1/nodes/' + enc(name)),
      get('/api/v1/events?order=desc&limit=200&node=' + enc(name))]);
    const n = d;
    // What the node claims beyond its allowance: placement never sees it (docs/behaviour.md#what-a-node-may-claim).
    const r = n.refusedFacts || { labels: [], kinds: [] };
    const refused = [...r.labels.map((l) => 'label ' + l), ...r.kinds.map((k) => 'kind ' + k)];
    const facts = [['Status', badge(n.status, tone(n.status))], ['Health', badge(n.health, tone(n.health))],
      ['Scheduling', badge(scheduling(n), tone(scheduling(n)))], ['Slots', `${n.slotsUsed}/${n.capacity.slots} used`],
      ['Executor kinds', dash(n.executorKinds.join(', '))], ['Labels', dash(n.labels.join(', '))],
      ...(refused.length ? [['Refused (outside its allowance)', refused.join(', ')]] : []),
      ['Secrets', dash(n.secrets.join(', '))], ['Version', dash(n.version)], ['Last seen', ago(n.lastSeenAt)],
      ['Generation', `${d.generation} (applied ${d.appliedGeneration})`], ['ID', n.id]];
    const blocked = n.drain ? n.drain.blocked.map((b) => [link('#/agents/' + enc(b.agentKey), b.agentKey), b.replica]) : [];
    return [h('h1', {}, 'Node ' + n.name),
      h('dl', { class: 'facts' }, facts.map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)])),
      n.drain ? table('Blocked by the drain (nowhere else to go)', ['Agent', 'Replica'], blocked, [1]) : null,
      table('Replicas it reports', ['Agent', 'Replica', 'State', 'Busy', 'Restarts', 'Message'],
        d.replicas.map((r) => [link('#/agents/' + enc(r.agentKey), r.agentKey), r.replica, badge(r.state, tone(r.state)),
          busy(r), r.restarts, dash(r.message)]), [1, 4]),
      eventsTable('Its events, newest first', ev.items)];
  }

  async function placements() {
    const page = await get(`/api/v1/placements?limit=${PAGE * 2}${current('placements')}`);
    const names = page.nodeNames || {};
    const rows = page.items.map((p) => [link('#/agents/' + enc(p.agentKey), p.agentKey), p.revision,
      p.nodeId ? link('#/nodes/' + enc(names[p.nodeId] || p.nodeId), names[p.nodeId] || p.nodeId) : '–',
      p.replicas, badge(p.status, tone(p.status)), dash(p.reason)]);
    return [h('h1', {}, 'Placements'),
      table('Placements by agent', ['Agent', 'Revision', 'Node', 'Replicas', 'Status', 'Reason'], rows, [1, 3]),
      pager('placements', page.nextCursor, refresh)];
  }

  // Items as the API gives them with order=desc: newest first.
  function eventsTable(caption, items) {
    const rows = items.map((e) => [String(e.seq), e.at, e.kind,
      e.agentKey ? link('#/agents/' + enc(e.agentKey), e.agentKey) : '–',
      e.node ? link('#/nodes/' + enc(e.node), e.node) : '–', dash(e.replica), e.message]);
    return table(caption, ['Seq', 'At', 'Kind', 'Agent', 'Node', 'Replica', 'Message'], rows, [0]);
  }

  // The agent's rollout (docs/behaviour.md#rolling-out-a-change): state, progress against the
  // budget, target and previous templates, the failed replica, the replicas its next steps
  // wait for (busy, or outside a maintenance window) and when the next window opens.
  function rolloutPanel(r) {
    const d = r.desiredReplicas || 0;
    const pct = d ? Math.round((100 * r.updatedReplicas) / d) : 100;
    const tpl = (t) => (t ? `${t.specId} (${t.image || "the kind's image"}, revision ${t.revision})` : '–');
    const failed = (r.failed || []).map((f) => `replica ${f.replica} on ${f.node}: ${f.reason}`).join('; ');
    const why = { busy: 'busy until', window: 'outside its maintenance window until' };
    const waiting = (r.waiting || []).map((w) => `replica ${w.replica} on ${w.node}: ${why[w.reason] || w.reason} ${ahead(w.until)}`);
    return h('section', { id: 'rollout' },
      h('h2', {}, 'Rollout'),
      h('dl', { class: 'facts' },
        h('dt', {}, 'State'), h('dd', { id: 'rollout-state' }, badge(r.state, rolloutTone[r.state] || 'muted')),
        h('dt', {}, 'Progress'), h('dd', { id: 'rollout-progress' },
          h('progress', { max: 100, value: pct }), ` ${r.updatedReplicas}/${d} updated, ${r.readyReplicas}/${d} ready, ` +
          `${r.unavailableReplicas} unavailable (budget ${r.budget})`),
        h('dt', {}, 'Target'), h('dd', { id: 'rollout-target' }, tpl(r.target)),
        h('dt', {}, 'Previous'), h('dd', {}, tpl(r.previous)),
        h('dt', {}, 'Failed'), h('dd', { id: 'rollout-failed' }, failed || '–'),
        h('dt', {}, 'Waiting for'), h('dd', { id: 'rollout-waiting' }, waiting.length ? waiting.map((w) => h('div', {}, w)) : '–'),
        r.nextWindow ? [h('dt', {}, 'Next window'), h('dd', { id: 'rollout-window' }, ahead(r.nextWindow))] : null,
        r.policyError ? [h('dt', {}, 'Policy'), h('dd', {}, r.policyError)] : null),
      r.message ? h('p', { class: 'hint' }, r.message) : null);
  }
  const rolloutTone = { complete: 'ok', progressing: 'warn', paused: 'warn', halted: 'bad', reverted: 'bad',
    waiting_for_window: 'warn' };

  async function agent(key) {
    const [e, ev, ro] = await Promise.all([get(`/api/v1/agents/${enc(key)}/placement?nodes=true`),
      get('/api/v1/events?order=desc&limit=200&agent=' + enc(key)),
      get(`/api/v1/agents/${enc(key)}/rollout`)]);
    const verdicts = (e.nodes || []).slice().sort((a, b) => Number(a.fits) - Number(b.fits));
    const shown = verdicts.slice(0, 200);
    return [h('h1', {}, 'Agent ' + e.agentKey),
      h('dl', { class: 'facts' },
        h('dt', {}, 'Phase'), h('dd', { id: 'phase' }, badge(e.phase, tone(e.phase))),
        h('dt', {}, 'Reason'), h('dd', { id: 'reason' }, e.reason ? `${e.reason.code}: ${e.reason.message}` : '–'),
        h('dt', {}, 'Revision'), h('dd', {}, e.revision),
        h('dt', {}, 'Replicas'), h('dd', {}, `${e.replicas.filter((r) => r.state === 'running').length}/${e.desiredReplicas} running`),
        e.spread ? h('dt', {}, 'Spread over ' + e.spread.label) : null,
        e.spread ? h('dd', { id: 'spread' }, Object.entries(e.spread.counts).map(([v, n]) => `${v || '(none)'}: ${n}`).join(', ') || '–') : null,
        e.priority ? h('dt', {}, 'Priority') : null,
        e.priority ? h('dd', { id: 'priority' }, String(e.priority)) : null),
      h('div', { id: 'problems' }, (e.problems || []).map((p) => h('p', { class: 'hint' }, h('strong', {}, 'Problem: '), p))),
      e.hint ? h('p', { class: 'hint', id: 'hint' }, h('strong', {}, 'What to do: '), e.hint) : null,
      rolloutPanel(ro),
      table('Where each replica is', ['Replica', 'Node', 'State', 'Busy', 'Message'],
        e.replicas.map((r) => [r.replica, r.node ? link('#/nodes/' + enc(r.node), r.node) : '–', badge(r.state, tone(r.state)),
          busy(r), dash(r.message)]), [0]),
      table('Placement filters, in order', ['Filter', 'Nodes before', 'Excluded', 'Detail'],
        e.filters.map((f) => [f.filter, f.before, f.excluded, filterDetail(f)]), [1, 2]),
      table(`Node verdicts (${verdicts.length}${verdicts.length > shown.length ? ', first 200: those that do not fit first' : ''})`,
        ['Node', 'Fits', 'Reason', 'Detail'],
        shown.map((v) => [link('#/nodes/' + enc(v.name), v.name), v.fits ? 'yes' : 'no', dash(v.reason), dash(v.detail)])),
      eventsTable('Its events, newest first', ev.items)];
  }

  function filterDetail(f) {
    const parts = Object.entries(f.missing || {}).filter(([, n]) => n > 0).map(([k, n]) => `${n} lack ${k}`);
    const x = f.exhausted;
    if (x) [['slots', x.slots], ['cpus', x.cpus], ['memory', x.memoryMb]].forEach(([k, n]) => { if (n) parts.push(`${n} short of ${k}`); });
    return parts.join(', ') || '–';
  }

  async function events() {
    // Opens at the newest; the pager goes back in time (the cursor of a newest-first page).
    const page = await get(`/api/v1/events?order=desc&limit=200${current('events')}`);
    return [h('h1', {}, 'Events'), eventsTable('Events, newest first', page.items),
      pager('events', page.nextCursor, refresh)];
  }

  // ---- routing and refresh ----------------------------------------------------------------
  function route() {
    const hash = decodeURIComponent(location.hash.replace(/^#\/?/, ''));
    const [what, ...rest] = hash.split('/');
    const arg = rest.join('/');
    switch (what) {
      case '': return overview;
      case 'nodes': return arg ? () => node(arg) : nodes;
      case 'placements': return placements;
      case 'agents': return () => agent(arg);
      case 'events': return events;
      default: return async () => [h('h1', {}, 'Not found'), h('p', {}, 'No such page. '), link('#/', 'Overview')];
    }
  }

  async function refresh() {
    clearTimeout(timer);
    if (!sessionStorage.getItem(TOKEN)) return login();
    const focused = document.activeElement && document.activeElement.id;
    try {
      const content = await render();
      main.replaceChildren(...content.filter(Boolean));
      document.getElementById('refreshed').textContent = 'updated ' + new Date().toLocaleTimeString();
      main.setAttribute('data-ready', 'true');
      if (window.fleetRenderedAt === undefined) window.fleetRenderedAt = performance.now(); // first render, for measurements
    } catch (e) {
      if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
        sessionStorage.removeItem(TOKEN);
        return login(e.message);
      }
      main.replaceChildren(h('p', { class: 'error', role: 'alert' }, 'Cannot load this page: ' + e.message));
    }
    if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
    timer = setTimeout(() => { if (!document.hidden) refresh(); else timer = setTimeout(refresh, REFRESH_MS); }, REFRESH_MS);
  }

  function login(message) {
    clearTimeout(timer);
    document.getElementById('signout').hidden = true;
    main.replaceChildren(document.getElementById('login').content.cloneNode(true));
    const err = document.getElementById('login-error');
    if (message) err.textContent = 'The token was refused: ' + message;
    document.getElementById('token').focus();
    document.getElementById('login-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN, document.getElementById('token').value.trim());
      start();
    });
  }

  function start() {
    document.getElementById('signout').hidden = false;
    render = route();
    refresh();
  }

  document.getElementById('signout').addEventListener('click', () => { sessionStorage.removeItem(TOKEN); login(); });
  window.addEventListener('hashchange', () => { main.removeAttribute('data-ready'); start(); main.focus(); });
  if (sessionStorage.getItem(TOKEN)) start(); else login();
})();
