// lapd admin console: one ES module, no build step, no dependencies.
// It reads the JSON API under ./api/ (guarded by the admin token, or by the
// loopback rule when lapd runs without one) and never stores anything but
// the token, in this tab's sessionStorage.

const api = new URL('api/', location.href)
const TOKEN_KEY = 'lapd-admin-token'
const POLL_MS = 2000
const SAMPLES = 60 // 2 minutes at POLL_MS

const $ = (id) => document.querySelector(`[data-testid="${id}"]`)

const state = {
  mode: 'token',
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  samples: [], // {at, calls, errors}
  rates: [], // {calls, errors} per second
  metrics: true,
  audit: { offset: 0, limit: 25, until: 0, more: false, filter: {} },
  timers: [],
  armed: null, // the revoke button waiting for its second click
  downSince: 0, // when lapd stopped answering the overview (ms), 0 while it answers
}

// --- API -------------------------------------------------------------------

class HTTPError extends Error {
  constructor(status, code, detail) {
    super(detail || code)
    this.status = status
    this.code = code
  }
}

async function call(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' }
  if (state.token) headers.Authorization = 'Bearer ' + state.token
  if (body !== undefined) headers['Content-Type'] = 'application/json'
  const res = await fetch(new URL(path, api), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store',
    credentials: 'omit',
  })
  const data = await res.json().catch(() => ({}))
  if (!res.ok) {
    const e = data.error || {}
    if (res.status === 401) onUnauthorized()
    throw new HTTPError(res.status, e.code || 'http-' + res.status, e.detail)
  }
  return data
}

// --- log-in ----------------------------------------------------------------

function showLogin(message) {
  stopPolling()
  $('console').hidden = true
  $('logout').hidden = true
  $('login').hidden = false
  $('login-error').textContent = message || ''
  $('meta').textContent = ''
  $('token').focus()
}

function onUnauthorized() {
  if (state.token) {
    state.token = ''
    sessionStorage.removeItem(TOKEN_KEY)
    showLogin('That token was refused. Check --admin-token and try again.')
  } else {
    showLogin('')
  }
}

async function login() {
  try {
    const r = await call('login', { method: 'POST', body: {} })
    state.mode = r.mode
    if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token)
    $('login').hidden = true
    $('console').hidden = false
    $('logout').hidden = state.mode !== 'token'
    await startConsole()
  } catch (e) {
    if (e.status !== 401) showLogin(e.message)
  }
}

$('login-form').addEventListener('submit', (ev) => {
  ev.preventDefault()
  state.token = $('token').value.trim()
  $('token').value = ''
  if (!state.token) return
  login()
})

$('logout').addEventListener('click', () => {
  state.token = ''
  sessionStorage.removeItem(TOKEN_KEY)
  showLogin('Logged out.')
})

// --- formatting ------------------------------------------------------------

function ago(ms, now = Date.now()) {
  if (!ms) return '–'
  const s = Math.max(0, Math.round((now - ms) / 1000))
  if (s < 60) return s + ' s ago'
  if (s < 3600) return Math.floor(s / 60) + ' min ago'
  if (s < 86400) return Math.floor(s / 3600) + ' h ago'
  return Math.floor(s / 86400) + ' d ago'
}

function duration(ms) {
  const s = Math.floor(ms / 1000)
  if (s < 60) return s + ' s'
  if (s < 3600) return Math.floor(s / 60) + ' min'
  if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min'
  return Math.floor(s / 86400) + ' d ' + Math.floor((s % 86400) / 3600) + ' h'
}

function clock(ms) {
  const d = new Date(ms)
  const today = new Date().toDateString() === d.toDateString()
  const t = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false })
  return today ? t : d.toLocaleDateString() + ' ' + t
}

function rate(v) {
  if (v === undefined || v === null || Number.isNaN(v)) return '–'
  return v >= 10 ? Math.round(v).toString() : v.toFixed(1)
}

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag)
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') e.className = v
    else if (k === 'dataset') Object.assign(e.dataset, v)
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v)
    else if (v !== undefined && v !== null) e.setAttribute(k, v)
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c)
  return e
}

function toast(text) {
  const t = $('toast')
  t.textContent = text
  t.classList.add('show')
  clearTimeout(toast.timer)
  toast.timer = setTimeout(() => t.classList.remove('show'), 3500)
}

// --- overview and chart ----------------------------------------------------

async function refreshOverview() {
  const o = await call('overview')
  const now = o.now
  const bits = ['version ' + o.version, 'up ' + duration(now - o.startedAt), o.held + ' held', o.mcpSessions + ' MCP sessions']
  if (o.draining) bits.push('shutting down')
  if (state.mode === 'loopback') bits.push('loopback access')
  $('meta').textContent = bits.join(' · ')
  $('tile-tabs').textContent = o.tabs
  $('tile-pending').textContent = o.pending
  state.metrics = o.metrics
  $('chart-note').hidden = o.metrics
  if (!o.metrics) return
  const last = state.samples[state.samples.length - 1]
  state.samples.push({ at: now, calls: o.calls, errors: o.errors })
  if (state.samples.length > SAMPLES + 1) state.samples.shift()
  if (last && now > last.at) {
    const dt = (now - last.at) / 1000
    state.rates.push({ calls: Math.max(0, o.calls - last.calls) / dt, errors: Math.max(0, o.errors - last.errors) / dt })
    if (state.rates.length > SAMPLES) state.rates.shift()
  }
  const r = state.rates[state.rates.length - 1]
  $('tile-calls').textContent = r ? rate(r.calls) : '…'
  $('tile-errors').textContent = r ? rate(r.errors) : '…'
  drawChart()
}

// The overview is the console's pulse: when lapd stops answering, the
// header says so (with since when) instead of leaving the last figures up
// as if they were live; the next answer puts them back.
async function watchOverview() {
  try {
    await refreshOverview()
    if (state.downSince) toast('lapd answers again.')
    state.downSince = 0
    $('meta').classList.remove('down')
  } catch (e) {
    if (e.status === 401) throw e
    if (!state.downSince) {
      state.downSince = Date.now()
      toast('lapd is not answering; retrying.')
    }
    $('meta').classList.add('down')
    $('meta').textContent = `lapd is not answering since ${clock(state.downSince)} (${e.message}); the figures below are from before. Retrying…`
  }
}

function drawChart() {
  const c = $('chart')
  const dpr = window.devicePixelRatio || 1
  const w = c.clientWidth
  const h = c.clientHeight
  if (!w || !h) return
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
    c.width = Math.round(w * dpr)
    c.height = Math.round(h * dpr)
  }
  const g = c.getContext('2d')
  g.setTransform(dpr, 0, 0, dpr, 0, 0)
  g.clearRect(0, 0, w, h)
  const css = getComputedStyle(document.documentElement)
  const color = (name) => css.getPropertyValue(name).trim()
  const top = Math.max(1, ...state.rates.map((r) => Math.max(r.calls, r.errors)))
  const pad = { l: 36, r: 6, t: 8, b: 16 }
  const x = (i) => pad.l + ((w - pad.l - pad.r) * i) / (SAMPLES - 1)
  const y = (v) => h - pad.b - ((h - pad.t - pad.b) * v) / top
  g.strokeStyle = color('--line')
  g.fillStyle = color('--muted')
  g.lineWidth = 1
  g.font = '11px system-ui, sans-serif'
  for (const v of [0, top / 2, top]) {
    g.beginPath()
    g.moveTo(pad.l, y(v))
    g.lineTo(w - pad.r, y(v))
    g.stroke()
    g.fillText(rate(v), 2, y(v) + 4)
  }
  g.fillText('−2 min', pad.l, h - 2)
  g.fillText('now', w - pad.r - 22, h - 2)
  const off = SAMPLES - state.rates.length
  for (const [key, col] of [['calls', '--calls'], ['errors', '--errors']]) {
    g.strokeStyle = color(col)
    g.lineWidth = 2
    g.beginPath()
    state.rates.forEach((r, i) => (i === 0 ? g.moveTo(x(off + i), y(r[key])) : g.lineTo(x(off + i), y(r[key]))))
    g.stroke()
  }
}

// --- sessions --------------------------------------------------------------

function statePill(s) {
  const cls = { active: 'ok', 'awaiting-claude': 'warn', 'pending-resume': 'warn', revoked: 'bad' }[s.status] || ''
  const text = { active: 'AI connected', 'awaiting-claude': 'waiting for the AI', 'pending-resume': 'reconnecting', revoked: 'revoked' }[s.status] || s.status
  return el('span', { class: 'pill ' + cls, title: 'token state: ' + s.status }, text)
}

function tabCell(s) {
  if (!s.connected) return el('span', { class: 'pill bad' }, 'disconnected')
  const vis = s.visible === undefined ? 'open' : s.visible ? 'visible' : 'hidden'
  const t = el('span', { class: 'pill ok' }, 'connected, ' + vis)
  if (s.reconnects) return el('span', {}, t, ' ', el('span', { class: 'muted small' }, s.reconnects + ' reconnects'))
  return t
}

function revokeButton(s) {
  const label = s.app || 'session'
  const b = el('button', { type: 'button', class: 'danger', dataset: { testid: 'revoke', tid: s.tid }, 'aria-label': `Revoke ${label} ${s.tid.slice(0, 8)}` }, 'Revoke')
  if (s.status === 'revoked') b.disabled = true
  b.addEventListener('click', async () => {
    if (state.armed !== b) {
      disarm()
      state.armed = b
      b.classList.add('armed')
      b.textContent = 'Confirm revoke'
      b.timer = setTimeout(disarm, 5000)
      return
    }
    disarm()
    b.disabled = true
    try {
      await call('revoke', { method: 'POST', body: { tid: s.tid } })
      toast(`Revoked ${label}: its token no longer works and the tab was told.`)
    } catch (e) {
      toast('Revoke failed: ' + e.message)
      b.disabled = false
    }
    refreshSessions()
    loadAudit()
  })
  return b
}

function disarm() {
  const b = state.armed
  if (!b) return
  clearTimeout(b.timer)
  b.classList.remove('armed')
  b.textContent = 'Revoke'
  state.armed = null
}

async function refreshSessions() {
  const { sessions, total } = await call('sessions?limit=200')
  const now = Date.now()
  const body = $('sessions').tBodies[0]
  if (state.armed && sessions.some((s) => s.tid === state.armed.dataset.tid)) return // do not pull the armed button away
  body.replaceChildren(
    ...sessions.map((s) =>
      el(
        'tr',
        { dataset: { testid: 'session', tid: s.tid } },
        el('td', { 'data-label': 'App' }, el('span', {}, (s.app || '(no hello yet)') + (s.appVersion ? ' ' + s.appVersion : '')), el('span', { class: 'tid', title: s.tid }, s.tid)),
        el('td', { 'data-label': 'Identity' }, s.uid || el('span', { class: 'muted' }, 'anonymous')),
        el('td', { 'data-label': 'State' }, statePill(s)),
        el('td', { 'data-label': 'Tab' }, tabCell(s)),
        el('td', { 'data-label': 'Last heartbeat' }, ago(s.lastHeartbeatAt, now)),
        el('td', { 'data-label': 'Calls' }, String(s.calls)),
        el('td', { 'data-label': 'Waiting', dataset: { testid: 'pending' } }, s.pending ? el('span', { class: 'pill warn' }, s.pending + ' approval' + (s.pending > 1 ? 's' : '')) : '0'),
        el('td', { class: 'actions' }, revokeButton(s)),
      ),
    ),
  )
  $('sessions-empty').hidden = sessions.length > 0
  $('sessions-count').textContent = total > sessions.length ? `${sessions.length} of ${total}` : String(total)
}

$('sessions-refresh').addEventListener('click', () => refreshSessions().catch((e) => toast(e.message)))

// --- audit -----------------------------------------------------------------

function toMs(v) {
  if (!v) return 0
  const t = new Date(v).getTime()
  return Number.isNaN(t) ? 0 : t
}

function readFilter() {
  const f = new FormData($('audit-filters'))
  return { tid: (f.get('tid') || '').trim(), event: f.get('event') || '', since: toMs(f.get('since')), until: toMs(f.get('until')) }
}

function detailText(d) {
  if (!d || !Object.keys(d).length) return ''
  return Object.entries(d)
    .map(([k, v]) => k + '=' + (typeof v === 'string' ? v : JSON.stringify(v)))
    .join('  ')
}

async function loadAudit() {
  const a = state.audit
  const f = a.filter
  const q = new URLSearchParams({ limit: a.limit, offset: a.offset })
  if (f.tid) q.set('tid', f.tid)
  if (f.event) q.set('event', f.event)
  if (f.since) q.set('since', f.since)
  const until = f.until || a.until
  if (until) q.set('until', until)
  let r
  try {
    r = await call('audit?' + q)
  } catch (e) {
    if (e.code === 'no-audit') {
      $('audit').tBodies[0].replaceChildren()
      $('audit-empty').hidden = false
      $('audit-empty').textContent = e.message
      return
    }
    throw e
  }
  a.more = r.more
  $('audit').tBodies[0].replaceChildren(
    ...r.entries.map((e) =>
      el(
        'tr',
        { dataset: { testid: 'audit-entry', event: e.event } },
        el('td', { 'data-label': 'Time', title: new Date(e.at).toISOString() }, clock(e.at)),
        el('td', { 'data-label': 'Event', class: 'ev-' + e.event }, e.event),
        el('td', { 'data-label': 'Session' }, e.tid ? el('button', { type: 'button', class: 'link tid', title: 'Show only this session', onclick: () => filterTID(e.tid) }, e.tid) : '–'),
        el('td', { 'data-label': 'Identity' }, e.uid || '–'),
        el('td', { 'data-label': 'Detail', class: 'detail' }, detailText(e.detail)),
      ),
    ),
  )
  $('audit-empty').hidden = r.entries.length > 0
  $('audit-empty').textContent = 'No entries match.'
  const page = Math.floor(a.offset / a.limit) + 1
  $('audit-page').textContent = 'page ' + page
  $('audit-newer').disabled = a.offset === 0
  $('audit-older').disabled = !a.more
}

function filterTID(tid) {
  $('filter-tid').value = tid
  applyFilter()
}

function applyFilter() {
  state.audit.filter = readFilter()
  state.audit.offset = 0
  state.audit.until = 0
  loadAudit().catch((e) => toast(e.message))
}

$('audit-filters').addEventListener('submit', (ev) => {
  ev.preventDefault()
  applyFilter()
})
$('audit-filters').addEventListener('reset', () => setTimeout(applyFilter))
$('audit-older').addEventListener('click', () => {
  const a = state.audit
  if (a.offset === 0 && !a.filter.until) a.until = Date.now() + 1 // pin the pages while paging back
  a.offset += a.limit
  loadAudit().catch((e) => toast(e.message))
})
$('audit-newer').addEventListener('click', () => {
  const a = state.audit
  a.offset = Math.max(0, a.offset - a.limit)
  if (a.offset === 0) a.until = 0
  loadAudit().catch((e) => toast(e.message))
})

// --- polling ---------------------------------------------------------------

function every(ms, fn) {
  const tick = () => fn().catch((e) => e.status !== 401 && console.warn('lapd admin:', e.message))
  tick()
  state.timers.push(setInterval(tick, ms))
}

function stopPolling() {
  state.timers.forEach(clearInterval)
  state.timers = []
}

async function startConsole() {
  stopPolling()
  const { events } = await call('events')
  const sel = $('filter-event')
  sel.replaceChildren(el('option', { value: '' }, 'any'), ...events.map((e) => el('option', { value: e }, e)))
  every(POLL_MS, watchOverview)
  every(5000, refreshSessions)
  every(5000, async () => {
    if (state.audit.offset === 0) await loadAudit()
  })
}

window.addEventListener('resize', () => state.metrics && drawChart())
window.__lapdAdmin = state

async function boot() {
  const r = await fetch(new URL('mode', location.href), { cache: 'no-store', credentials: 'omit' })
  const { mode } = await r.json()
  state.mode = mode
  if (mode === 'token' && !state.token) return showLogin('')
  login()
}
boot().catch((e) => showLogin('lapd did not answer: ' + e.message))
