// Drives createAgent with a fake WebSocket, fetch and storage (Node has no
// browser). The real-browser path is covered by the chromedp E2E.
import { test, mock } from 'node:test'
import assert from 'node:assert/strict'
import { createAgent } from '../lapd.js'

class FakeWS {
  static all = []
  constructor(url, protocols) { this.url = url; this.protocols = protocols; this.readyState = 0; this.sent = []; this.closedWith = null; FakeWS.all.push(this) }
  send(s) { this.sent.push(JSON.parse(s)) }
  close(code) { this.closedWith = code ?? 1000; this.readyState = 3 }
  // test side
  open() { this.readyState = 1; this.onopen && this.onopen({}) }
  frame(f) { this.onmessage && this.onmessage({ data: JSON.stringify(f) }) }
  drop(code = 1006, reason = '') { this.readyState = 3; this.onclose && this.onclose({ code, reason }) }
  frames(t) { return this.sent.filter((f) => f.t === t) }
}

function memStorage(init = {}) {
  const m = new Map(Object.entries(init))
  return { getItem: (k) => (m.has(k) ? m.get(k) : null), setItem: (k, v) => m.set(k, String(v)), removeItem: (k) => m.delete(k), map: m }
}

function json(status, body, headers = {}) {
  return { ok: status >= 200 && status < 300, status, statusText: '', headers: { get: (k) => headers[k] ?? null }, json: async () => body }
}

const MINT = { token: 'agt_TESTTOKEN', tabSecret: 'tab_TESTSECRET', tid: 't-1', wsUrl: 'ws://app.test/agent/ws', lapUrl: 'http://app.test/agent/lap/v1', expiresAt: Date.now() + 3600e3, lapVersion: 2 }

function setup({ storage = memStorage(), routes = {}, ...extra } = {}) {
  FakeWS.all = []
  const calls = []
  const fetch = async (url, init) => {
    calls.push({ url, init })
    const path = new URL(url).pathname
    if (routes[path]) return routes[path](init)
    if (path === '/agent/mint') return json(200, MINT)
    if (path === '/agent/revoke') return json(200, { status: 'revoked' })
    return json(404, { error: { code: 'not-found' } })
  }
  let state = { tasks: [], filter: 'all' }
  const subs = new Set()
  const store = {
    get: () => state,
    set(next) { state = next; for (const fn of subs) fn() },
  }
  const agent = createAgent({
    app: { name: 'test', version: '1' },
    getState: store.get,
    subscribe: (fn) => { subs.add(fn); return () => subs.delete(fn) },
    actions: {
      addTask: {
        intent: 'Add a task',
        schema: { type: 'object', required: ['title'], properties: { title: { type: 'string', minLength: 1 } }, additionalProperties: false },
        handler: ({ title }) => store.set({ ...state, tasks: [...state.tasks, { title, done: false }] }),
      },
      save: {
        intent: 'Save (async)',
        handler: () => new Promise((res) => setTimeout(() => { store.set({ ...state, saved: true }); res() }, 30)),
      },
      fail: { intent: 'Fails later', handler: () => Promise.reject(new Error('boom')) },
      clearAll: { intent: 'Delete every task', requiresConfirm: true, handler: () => store.set({ ...state, tasks: [] }) },
      reset: { intent: 'Reset', humanOnly: true, handler: () => {} },
    },
    context: (s) => ({ summary: `${s.tasks.length} tasks` }),
    ui: false, baseUrl: 'http://app.test', storage, fetch, WebSocket: FakeWS,
    ...extra,
  })
  return { agent, calls, store, storage, subs }
}

const tick = () => new Promise((r) => setImmediate(r))

// listenerTarget is a fake document or window: the listeners it was given,
// by event name, to call from the test.
function listenerTarget() {
  const handlers = {}
  return { handlers, target: { addEventListener: (n, fn) => { handlers[n] = fn }, removeEventListener: (n) => { delete handlers[n] } } }
}

// FakeWorker stands for the dedicated worker lapd.js runs its timers on in
// a hidden page: it answers each wait at once (setImmediate), where the
// page's own timers would fire once a second at best.
class FakeWorker {
  static made = []
  constructor(url) { this.url = url; this.posted = []; FakeWorker.made.push(this) }
  postMessage(m) { this.posted.push(m); setImmediate(() => this.onmessage && this.onmessage({ data: m[0] })) }
  terminate() { this.terminated = true }
}

async function withFakeWorker(fn) {
  const saved = globalThis.Worker
  FakeWorker.made = []
  globalThis.Worker = FakeWorker
  try {
    await fn()
  } finally {
    if (saved === undefined) delete globalThis.Worker
    else globalThis.Worker = saved
  }
}
async function until(fn, what) {
  for (let i = 0; i < 500; i++) { if (fn()) return; await new Promise((r) => setTimeout(r, 2)) }
  throw new Error('timed out waiting for ' + what)
}

async function connected(opts) {
  const env = setup(opts)
  env.agent.connect()
  await until(() => FakeWS.all.length === 1, 'socket')
  env.ws = FakeWS.all[0]
  env.ws.open()
  return env
}

async function rpc(ws, tool, args = {}, id = 'r' + Math.random().toString(16).slice(2)) {
  ws.frame({ t: 'rpc', id, tool, args })
  await until(() => ws.sent.some((f) => (f.t === 'rpc-reply' || f.t === 'rpc-error') && f.id === id), `reply to ${tool}`)
  await until(() => ws.sent.some((f) => f.t === 'log-append' && f.entry.id === id), `log-append for ${tool}`)
  return { reply: ws.sent.find((f) => (f.t === 'rpc-reply' || f.t === 'rpc-error') && f.id === id), log: ws.sent.find((f) => f.t === 'log-append' && f.entry.id === id).entry }
}

test('mint, hello, active, connect line, persisted session', async () => {
  const statuses = []
  const env = setup()
  env.agent.on('status', (s) => statuses.push(s))
  env.agent.connect()
  await until(() => FakeWS.all.length === 1, 'socket')
  const ws = FakeWS.all[0]
  // The token rides in the sub-protocol list, never in the URL; the tab
  // secret beside it (minted with {tab:true}) is never in the connect line.
  assert.equal(ws.url, 'ws://app.test/agent/ws')
  assert.deepEqual(ws.protocols, ['lapd.v2', 'lapd.token.agt_TESTTOKEN', 'lapd.tab.tab_TESTSECRET'])
  assert.equal(env.calls[0].url, 'http://app.test/agent/mint')
  assert.equal(env.calls[0].init.body, '{"tab":true}')
  assert.equal(env.calls[0].init.credentials, 'include')
  ws.open()
  const [hello] = ws.frames('hello')
  assert.equal(hello.appName, 'test')
  assert.equal(hello.lapVersion, 2)
  assert.equal(hello.visible, true)
  assert.deepEqual(hello.policy.variants.reset, { intent: 'Reset', humanOnly: true })
  assert.equal(typeof hello.schemaHash, 'string')
  assert.equal(env.agent.status, 'pending-claude')
  assert.equal(env.agent.connectLine, 'Connect to my app with lapd: connect_session url=http://app.test/agent/lap/v1 token=agt_TESTTOKEN')
  ws.frame({ t: 'active' })
  assert.equal(env.agent.status, 'active')
  assert.deepEqual(statuses, ['minting', 'pending-claude', 'active'])
  const stored = JSON.parse(env.storage.getItem('lapd:session'))
  assert.deepEqual(Object.keys(stored).sort(), ['expiresAt', 'lapUrl', 'tabSecret', 'tid', 'token', 'wsUrl'])
  assert.ok(!env.agent.connectLine.includes('tab_'), 'the tab secret is not for the LLM')
  assert.equal(env.agent.session.tabSecret, undefined)
  env.agent.destroy()
})

test('a re-pair before any model used the token keeps asking for the line', async () => {
  const storage = memStorage({ 'lapd:session': JSON.stringify(MINT) })
  const env = setup({ storage })
  const events = []
  env.agent.on('active', () => events.push('active'))
  await until(() => FakeWS.all.length === 1, 'socket')
  const ws = FakeWS.all[0]
  ws.open()
  // The page was reloaded before the human pasted the line: the server's
  // re-pair push says no model has used the session.
  ws.frame({ t: 'active', model: false })
  assert.equal(env.agent.status, 'pending-claude')
  assert.deepEqual(events, [])
  // The model's first call.
  ws.frame({ t: 'active' })
  assert.equal(env.agent.status, 'active')
  assert.deepEqual(events, ['active'])
  env.agent.destroy()
})

test('mint failure → error with http code', async () => {
  const env = setup({ routes: { '/agent/mint': () => json(401, { error: { code: 'auth-required' } }) } })
  env.agent.connect()
  await until(() => env.agent.status === 'error', 'error')
  assert.deepEqual(env.agent.error, { code: 'http-401', detail: 'auth-required' })
  assert.equal(FakeWS.all.length, 0)
})

test('a stored session is restored without a new mint', async () => {
  const storage = memStorage({ 'lapd:session': JSON.stringify(MINT) })
  const env = setup({ storage })
  await until(() => FakeWS.all.length === 1, 'socket')
  assert.equal(env.calls.length, 0)
  assert.equal(env.agent.status, 'pending-claude')
  env.agent.destroy()
  const expired = memStorage({ 'lapd:session': JSON.stringify({ ...MINT, expiresAt: Date.now() - 1 }) })
  const env2 = setup({ storage: expired })
  await tick()
  assert.equal(FakeWS.all.length, 0)
  assert.equal(env2.agent.status, 'idle')
})

test('read tools reply and log with entry.id = rpc id', async () => {
  const { agent, ws, store } = await connected()
  store.set({ tasks: [{ title: 'a/b', done: false }], filter: 'all' })
  let r = await rpc(ws, 'get_state', { path: '/tasks/0' }, 'id-1')
  assert.deepEqual(r.reply, { t: 'rpc-reply', id: 'id-1', result: { state: { title: 'a/b', done: false } } })
  assert.equal(r.log.kind, 'read')
  assert.equal(r.log.intent, 'Read app state')
  r = await rpc(ws, 'get_state', { path: '/nope' })
  assert.deepEqual(r.reply.result, {})
  r = await rpc(ws, 'query_state', { path: '/tasks/5' })
  assert.equal(r.reply.result.found, false)
  r = await rpc(ws, 'query_state', { path: '/filter' })
  assert.deepEqual(r.reply.result, { found: true, value: 'all' })
  r = await rpc(ws, 'query_state', {})
  assert.equal(r.reply.t, 'rpc-error')
  assert.equal(r.reply.code, 'invalid')
  assert.equal(r.log.kind, 'error')
  r = await rpc(ws, 'list_actions')
  assert.deepEqual(r.reply.result.actions.map((a) => a.variant), ['addTask', 'save', 'fail', 'clearAll'])
  r = await rpc(ws, 'observe')
  assert.deepEqual(Object.keys(r.reply.result), ['state', 'actions', 'context'])
  assert.deepEqual(r.reply.result.context, { summary: '1 tasks' })
  r = await rpc(ws, 'would_dispatch', { msg: { type: 'addTask', title: 'x' } })
  assert.deepEqual(r.reply.result, { status: 'rejected', reason: 'unsupported', detail: 'this app has no pure reducer; use send_message' })
  r = await rpc(ws, 'would_dispatch', { msg: { type: 'reset' } })
  assert.equal(r.reply.result.reason, 'human-only')
  ws.frame({ t: 'rpc', id: 'u1', tool: 'teleport', args: {} })
  await until(() => ws.sent.some((f) => f.id === 'u1'), 'unknown tool')
  assert.deepEqual(ws.sent.find((f) => f.id === 'u1'), { t: 'rpc-error', id: 'u1', code: 'invalid', detail: 'unknown tool: teleport' })
  agent.destroy()
})

test('send_message: dispatched with diff, async effects drained, gates', async () => {
  const { agent, ws, store } = await connected()
  let r = await rpc(ws, 'send_message', { msg: { type: 'addTask', title: 'Milk' }, drainQuietMs: 10 })
  assert.equal(r.reply.result.status, 'dispatched')
  assert.deepEqual(r.reply.result.stateDiff, [{ op: 'add', path: '/tasks/0', value: { title: 'Milk', done: false } }])
  assert.equal(r.reply.result.drain.timedOut, false)
  assert.ok(r.reply.result.drain.effectsObserved >= 1)
  assert.ok(Array.isArray(r.reply.result.actions))
  assert.equal('stateAfter' in r.reply.result, false)
  assert.equal(r.log.kind, 'dispatched')
  assert.equal(r.log.detail, 'title="Milk"')
  assert.deepEqual(r.log.stateDiff, r.reply.result.stateDiff)

  // The save handler's promise commits after 30 ms; a 10 ms quiet window must still wait for it.
  r = await rpc(ws, 'send_message', { msg: { type: 'save' }, drainQuietMs: 10, includeState: true })
  assert.deepEqual(r.reply.result.stateDiff, [{ op: 'add', path: '/saved', value: true }])
  assert.equal(r.reply.result.stateAfter.saved, true)

  r = await rpc(ws, 'send_message', { msg: { type: 'fail' }, drainQuietMs: 5 })
  assert.equal(r.reply.result.status, 'dispatched')
  assert.equal(r.reply.result.drain.errors[0].message, 'boom')
  r = await rpc(ws, 'describe_context')
  assert.match(r.reply.result.context.hints[0], /fail.*boom/)

  r = await rpc(ws, 'send_message', { msg: { type: 'save' }, waitFor: 'none' })
  assert.deepEqual(r.reply.result.stateDiff, [])
  assert.equal(r.reply.result.drain.effectsObserved, 0)

  r = await rpc(ws, 'send_message', { msg: { type: 'save' }, drainQuietMs: 100, timeoutMs: 10 })
  assert.equal(r.reply.result.drain.timedOut, true)

  const gates = [
    [{ type: 'reset' }, 'human-only'],
    [{ type: 'nope' }, 'invalid'],
    [{ type: 'addTask', title: '' }, 'invalid'],
    [{ title: 'x' }, 'invalid'],
  ]
  for (const [msg, reason] of gates) {
    r = await rpc(ws, 'send_message', { msg })
    assert.equal(r.reply.result.status, 'rejected')
    assert.equal(r.reply.result.reason, reason)
    assert.equal(r.log.kind, 'blocked')
  }
  r = await rpc(ws, 'describe_context')
  assert.match(r.reply.result.context.hints[0], /rejected/)
  assert.equal(store.get().tasks.length, 1)
  agent.destroy()
})

test('send_message idempotencyKey: one dispatch per key, across concurrent repeats and a reload', async () => {
  const storage = memStorage()
  const env = await connected({ storage })
  const { ws, store } = env
  let r = await rpc(ws, 'send_message', { msg: { type: 'addTask', title: 'Milk' }, idempotencyKey: 'k1', idempotencyTtlMs: 60000 })
  assert.equal(r.reply.result.status, 'dispatched')
  // a repeat (the server lost track, e.g. it restarted) gets the same answer, no second task
  const again = await rpc(ws, 'send_message', { msg: { type: 'addTask', title: 'Milk' }, idempotencyKey: 'k1', idempotencyTtlMs: 60000 })
  assert.deepEqual(again.reply.result, r.reply.result)
  assert.match(again.log.intent, /not dispatched again/)
  assert.equal(store.get().tasks.length, 1)
  // two at once: the save handler takes 30 ms; both get its one result
  const [a, b] = await Promise.all([
    rpc(ws, 'send_message', { msg: { type: 'save' }, idempotencyKey: 'k2' }),
    rpc(ws, 'send_message', { msg: { type: 'save' }, idempotencyKey: 'k2' }),
  ])
  assert.deepEqual(a.reply.result, b.reply.result)
  // a big result is not kept across a reload
  store.set({ ...store.get(), blob: 'x'.repeat(40 << 10) })
  r = await rpc(ws, 'send_message', { msg: { type: 'addTask', title: 'Big' }, idempotencyKey: 'k3', includeState: true })
  assert.equal(r.reply.result.status, 'dispatched')
  const kept = JSON.parse(storage.getItem('lapd:idem'))
  assert.deepEqual(kept.map((e) => [e.key, 'result' in e]), [['k1', true], ['k2', true], ['k3', false]])
  env.agent.destroy()

  // reload: a new agent on the same sessionStorage
  const env2 = await connected({ storage })
  env2.store.set({ tasks: [], filter: 'all' })
  r = await rpc(env2.ws, 'send_message', { msg: { type: 'addTask', title: 'Milk' }, idempotencyKey: 'k1' })
  assert.equal(r.reply.result.status, 'dispatched', 'the kept result')
  r = await rpc(env2.ws, 'send_message', { msg: { type: 'addTask', title: 'Big' }, idempotencyKey: 'k3' })
  assert.equal(r.reply.t, 'rpc-error')
  assert.equal(r.reply.code, 'outcome-unknown')
  assert.match(r.reply.detail, /observe before retrying/)
  assert.equal(env2.store.get().tasks.length, 0, 'nothing dispatched again after the reload')
  r = await rpc(env2.ws, 'send_message', { msg: { type: 'addTask', title: 'New' }, idempotencyKey: 'k4' })
  assert.equal(env2.store.get().tasks.length, 1, 'a new key dispatches')
  env2.agent.destroy()
})

test('confirm: propose, approve while down is queued and sent after reconnect', async () => {
  const { agent, ws, store } = await connected()
  store.set({ tasks: [{ title: 'a' }], filter: 'all' })
  const seen = []
  agent.on('confirm', (pending) => seen.push(pending.length))
  const r = await rpc(ws, 'send_message', { msg: { type: 'clearAll' }, reason: 'user asked' })
  assert.equal(r.reply.result.status, 'pending-confirmation')
  assert.equal(r.log.kind, 'proposed')
  const id = r.reply.result.confirmId
  assert.deepEqual(agent.pendingConfirms().map((c) => [c.id, c.variant, c.reason, c.status]), [[id, 'clearAll', 'user asked', 'pending']])
  assert.equal(store.get().tasks.length, 1, 'not run before approval')

  ws.drop(1006)
  await until(() => agent.status === 'reconnecting', 'reconnecting')
  await agent.approve(id)
  assert.equal(store.get().tasks.length, 0, 'approved msg runs in the app')
  assert.equal(ws.frames('confirm-resolved').length, 0)

  agent.connect() // retry now instead of after the backoff
  await until(() => FakeWS.all.length === 2, 'second socket')
  const ws2 = FakeWS.all[1]
  ws2.open()
  const [hello, resolved] = ws2.sent
  assert.equal(hello.t, 'hello')
  assert.equal(resolved.t, 'confirm-resolved')
  assert.equal(resolved.confirmId, id)
  assert.equal(resolved.outcome, 'confirmed')
  assert.deepEqual(resolved.stateAfter.tasks, [])
  assert.equal(agent.status, 'pending-claude')
  assert.ok(seen.length >= 2)
  // The server's confirm-sync may still list it (it raced the flushed answer): not shown again.
  ws2.frame({ t: 'confirm-sync', pending: [{ confirmId: id, variant: 'clearAll', payload: {} }] })
  assert.deepEqual(agent.pendingConfirms(), [])
  agent.destroy()
})

test('confirm-sync of an approval answered here re-sends the answer (lost with the socket), also after a reload', async () => {
  const storage = memStorage()
  let clears = 0
  const actions = { clearAll: { intent: 'Delete every task', requiresConfirm: true, handler: () => { clears++ } } }
  const env = await connected({ storage, actions })
  const r = await rpc(env.ws, 'send_message', { msg: { type: 'clearAll' } })
  const id = r.reply.result.confirmId
  assert.equal(await env.agent.approve(id), true)
  assert.equal(env.ws.frames('confirm-resolved').length, 1)
  // the server restarted before it read the answer: its confirm-sync still lists the approval
  env.ws.frame({ t: 'confirm-sync', pending: [{ confirmId: id, variant: 'clearAll', payload: {} }] })
  assert.deepEqual(env.agent.pendingConfirms(), [], 'not shown again')
  assert.deepEqual(env.ws.frames('confirm-resolved').map((f) => [f.confirmId, f.outcome]), [[id, 'confirmed'], [id, 'confirmed']])
  env.agent.destroy()
  // a reload: the answer is remembered in sessionStorage
  const env2 = await connected({ storage, actions })
  env2.ws.frame({ t: 'confirm-sync', pending: [{ confirmId: id, variant: 'clearAll', payload: {} }] })
  assert.deepEqual(env2.agent.pendingConfirms(), [])
  assert.deepEqual(env2.ws.frames('confirm-resolved').map((f) => [f.confirmId, f.outcome]), [[id, 'confirmed']])
  assert.equal(clears, 1, 'the action ran once')
  env2.agent.destroy()
})

test('confirm: reject, confirm-expire, confirm-sync', async () => {
  const { agent, ws } = await connected()
  let r = await rpc(ws, 'send_message', { msg: { type: 'clearAll' } })
  const a = r.reply.result.confirmId
  assert.equal(agent.reject(a), true)
  assert.deepEqual(ws.frames('confirm-resolved').at(-1), { t: 'confirm-resolved', confirmId: a, outcome: 'user-cancelled' })
  assert.equal(agent.reject(a), false, 'only once')

  r = await rpc(ws, 'send_message', { msg: { type: 'clearAll' } })
  const b = r.reply.result.confirmId
  ws.frame({ t: 'confirm-expire', confirmId: b, reason: 'timeout' })
  assert.deepEqual(agent.pendingConfirms(), [])
  assert.equal(await agent.approve(b), false, 'a late Approve cannot fire')
  assert.match(agent.log().at(-1).detail, /expired \(timeout\)/)

  ws.frame({ t: 'confirm-sync', pending: [{ confirmId: 'c9', variant: 'clearAll', payload: {}, intent: 'Delete every task', reason: 'r', proposedAt: 1, expiresAt: 2 }] })
  assert.deepEqual(agent.pendingConfirms().map((c) => [c.id, c.intent, c.status]), [['c9', 'Delete every task', 'pending']])
  ws.frame({ t: 'confirm-sync', pending: [{ confirmId: 'c9', variant: 'clearAll' }] })
  assert.equal(agent.pendingConfirms().length, 1, 'no duplicates')
  // One proposed here learns lapd's deadline from a confirm-sync that carries it.
  r = await rpc(ws, 'send_message', { msg: { type: 'clearAll' } })
  const c = r.reply.result.confirmId
  assert.equal(agent.pendingConfirms().find((x) => x.id === c).expiresAt, undefined)
  ws.frame({ t: 'confirm-sync', pending: [{ confirmId: c, variant: 'clearAll', expiresAt: 12345 }] })
  assert.equal(agent.pendingConfirms().find((x) => x.id === c).expiresAt, 12345)
  assert.equal(agent.pendingConfirms().length, 2, 'still no duplicates')
  agent.destroy()
})

test('confirm-sync and approve re-gate: human-only, unknown or schema-failing approvals never run', async () => {
  let resets = 0
  let clears = 0
  const actions = {
    addTask: { intent: 'Add a task', schema: { type: 'object', required: ['title'], properties: { title: { type: 'string' } } }, handler: () => {} },
    clearAll: { intent: 'Delete every task', requiresConfirm: true, handler: () => { clears++ } },
    reset: { intent: 'Reset everything', humanOnly: true, handler: () => { resets++ } },
  }
  const { agent, ws } = await connected({ actions })
  // What a server that stored {"type":"clearAll","Type":"reset"} as "reset" re-delivered after a reload.
  ws.frame({ t: 'confirm-sync', pending: [
    { confirmId: 'h1', variant: 'reset', payload: { Type: 'reset' }, intent: 'Reset everything' },
    { confirmId: 'u1', variant: 'nuke', payload: {} },
    { confirmId: 's1', variant: 'addTask', payload: { title: 5 } },
    { confirmId: 'ok', variant: 'clearAll', payload: {} },
  ] })
  assert.deepEqual(agent.pendingConfirms().map((c) => c.id), ['ok'])
  const answers = ws.frames('confirm-resolved').map((f) => [f.confirmId, f.outcome])
  assert.deepEqual(answers, [['h1', 'user-cancelled'], ['u1', 'user-cancelled'], ['s1', 'user-cancelled']])
  assert.equal(await agent.approve('h1'), false)
  assert.equal(resets, 0, 'the human-only handler never ran')
  assert.match(agent.log().find((e) => e.id === 'confirm-h1').detail, /human-only/)

  // approve() gates again: the app made clearAll human-only after it was proposed.
  const r = await rpc(ws, 'send_message', { msg: { type: 'clearAll' } })
  const id = r.reply.result.confirmId
  actions.clearAll.humanOnly = true
  assert.equal(await agent.approve(id), false)
  assert.equal(clears, 0, 'not dispatched')
  assert.deepEqual(ws.frames('confirm-resolved').at(-1), { t: 'confirm-resolved', confirmId: id, outcome: 'user-cancelled' })
  assert.deepEqual(agent.pendingConfirms().map((c) => c.id), ['ok'])
  assert.equal(await agent.approve('ok'), false, 'clearAll is human-only now')
  actions.clearAll.humanOnly = false
  agent.destroy()
})

test('without subscribe(), watches poll the state; a hidden page polls on a worker timer', async () => {
  await withFakeWorker(async () => {
    const document = { visibilityState: 'visible', addEventListener: () => {}, removeEventListener: () => {} }
    const { agent, ws, store } = await connected({ document, subscribe: undefined, pollMs: 5 })
    ws.frame({ t: 'watch', id: 'w1', path: '/filter' })
    store.set({ ...store.get(), filter: 'done' })
    await until(() => ws.frames('state-update').length === 1, 'a polled change')
    ws.frame({ t: 'unwatch', id: 'w1' })
    assert.equal(FakeWorker.made.length, 0, 'a shown page polls on its own timers')

    // Hidden, with a poll every 5 s: only the worker's timer finds the change in time.
    await connected({ document, subscribe: undefined, pollMs: 5000 }).then(async ({ agent: a2, ws: ws2, store: s2 }) => {
      document.visibilityState = 'hidden'
      ws2.frame({ t: 'watch', id: 'w2', path: '/filter' })
      s2.set({ ...s2.get(), filter: 'done' })
      await until(() => ws2.frames('state-update').length === 1, 'a change polled while hidden')
      assert.equal(FakeWorker.made.length, 1)
      assert.equal(FakeWorker.made[0].posted[0][1], 5000)
      ws2.frame({ t: 'unwatch', id: 'w2' })
      a2.destroy()
    })
    agent.destroy()
  })
})

test('watch → state-update when the pointed value changes; log-push is echoed', async () => {
  const { agent, ws, store } = await connected()
  ws.frame({ t: 'watch', id: 'w1', path: '/filter' })
  store.set({ ...store.get(), tasks: [1] })
  assert.equal(ws.frames('state-update').length, 0, 'other paths do not fire')
  store.set({ ...store.get(), filter: 'done' })
  assert.deepEqual(ws.frames('state-update'), [{ t: 'state-update', id: 'w1', path: '/filter', stateAfter: { tasks: [1], filter: 'done' } }])
  ws.frame({ t: 'unwatch', id: 'w1' })
  store.set({ ...store.get(), filter: 'all' })
  assert.equal(ws.frames('state-update').length, 1)

  const entry = { id: 'narrate-1', at: 1, kind: 'narrate', intent: 'Agent narrated', detail: 'Hello' }
  ws.frame({ t: 'log-push', entry })
  assert.deepEqual(ws.frames('log-append').at(-1), { t: 'log-append', entry })
  assert.deepEqual(agent.log().at(-1), entry)
  agent.destroy()
})

test('refused upgrade: close without open → probe 401 → error, no retry, session cleared', async () => {
  const logs = []
  const env = setup({ routes: { '/agent/lap/v1/describe': (init) => { logs.push(init.headers.Authorization); return json(401, { error: { code: 'auth-failed' } }) } } })
  env.agent.connect()
  await until(() => FakeWS.all.length === 1, 'socket')
  FakeWS.all[0].drop(1006)
  await until(() => env.agent.status === 'error', 'error')
  assert.equal(env.agent.error.code, 'auth-failed')
  assert.deepEqual(logs, ['Bearer agt_TESTTOKEN'])
  assert.equal(env.storage.getItem('lapd:session'), null)
  assert.equal(env.agent.connectLine, null)
  await new Promise((r) => setTimeout(r, 20))
  assert.equal(FakeWS.all.length, 1, 'no retry loop')
})

test('probe: 503 expired stops, 503 pending reconnects', async () => {
  const env = setup({ routes: { '/agent/lap/v1/describe': () => json(503, { error: { code: 'paused', reconnect: 'expired' } }, { 'X-LLui-Reconnect': 'expired' }) } })
  env.agent.connect()
  await until(() => FakeWS.all.length === 1, 'socket')
  FakeWS.all[0].drop(1006)
  await until(() => env.agent.status === 'error', 'error')
  assert.equal(env.agent.error.code, 'expired')

  const env2 = setup({ routes: { '/agent/lap/v1/describe': () => json(503, { error: { code: 'paused', reconnect: 'pending' } }, { 'X-LLui-Reconnect': 'pending' }) } })
  env2.agent.connect()
  await until(() => FakeWS.all.length === 1, 'socket')
  FakeWS.all[0].drop(1006)
  await until(() => env2.agent.status === 'reconnecting', 'reconnecting')
  env2.agent.destroy()
})

test('close codes and the revoked frame stop reconnecting', async (t) => {
  for (const [how, want, code] of [[(ws) => ws.drop(4001), 'idle', null], [(ws) => ws.frame({ t: 'revoked' }), 'idle', null], [(ws) => ws.drop(4002), 'error', 'superseded'], [(ws) => ws.drop(4426), 'error', 'version']]) {
    await t.test(`${want} ${code}`, async () => {
      const { agent, ws, storage } = await connected()
      let revoked = 0
      agent.on('revoked', () => revoked++)
      how(ws)
      assert.equal(agent.status, want)
      if (code) assert.equal(agent.error.code, code)
      else { assert.equal(revoked, 1); assert.equal(storage.getItem('lapd:session'), null); assert.equal(agent.message, 'The session was revoked') }
      await new Promise((r) => setTimeout(r, 10))
      assert.equal(FakeWS.all.length, 1)
      agent.destroy()
    })
  }
})

test('disconnect revokes on the server and forgets the session', async () => {
  const { agent, ws, calls, storage } = await connected()
  agent.disconnect()
  assert.equal(agent.status, 'idle')
  assert.equal(ws.closedWith, 1000)
  await until(() => calls.some((c) => c.url.endsWith('/agent/revoke')), 'revoke call')
  assert.deepEqual(JSON.parse(calls.find((c) => c.url.endsWith('/agent/revoke')).init.body), { tid: 't-1', tabSecret: 'tab_TESTSECRET' })
  assert.equal(storage.getItem('lapd:session'), null)
})

test('resume claims a new token and reconnects', async () => {
  const env = setup({ routes: { '/agent/resume/claim': () => json(200, { ...MINT, token: 'agt_NEW', tabSecret: 'tab_NEW' }) } })
  assert.equal(await env.agent.resume('t-1'), true)
  await until(() => FakeWS.all.length === 1, 'socket')
  assert.deepEqual(FakeWS.all[0].protocols, ['lapd.v2', 'lapd.token.agt_NEW', 'lapd.tab.tab_NEW'])
  assert.equal(JSON.parse(env.storage.getItem('lapd:session')).token, 'agt_NEW')
  env.agent.destroy()
})

test('resume of this tab\'s own session proves it with the tab secret', async () => {
  const env = await connected({ routes: { '/agent/resume/claim': () => json(200, { ...MINT, token: 'agt_NEW', tabSecret: 'tab_NEW' }) } })
  assert.equal(await env.agent.resume('t-1'), true)
  assert.deepEqual(JSON.parse(env.calls.find((c) => c.url.endsWith('/resume/claim')).init.body), { tid: 't-1', tabSecret: 'tab_TESTSECRET' })
  assert.equal(await env.agent.resume('t-other'), true)
  assert.deepEqual(JSON.parse(env.calls.filter((c) => c.url.endsWith('/resume/claim'))[1].init.body), { tid: 't-other' })
  env.agent.destroy()
})

test('heartbeat: behind an upload, two missed pongs drop the socket and reconnect', async () => {
  const { agent, ws } = await connected() // (its waits use real timers)
  mock.timers.enable({ apis: ['setInterval', 'setTimeout'] })
  try {
    ws.bufferedAmount = 1 // every ping waits behind queued bytes: not timed
    ws.frame({ t: 'hello-ack', lapVersion: 2, minClientVersion: 2, heartbeatMs: 1000 })
    mock.timers.tick(1000)
    assert.equal(ws.frames('ping').length, 1)
    ws.frame({ t: 'pong', at: 1 })
    mock.timers.tick(1000)
    mock.timers.tick(1000)
    assert.equal(ws.frames('ping').length, 3)
    assert.equal(agent.status, 'pending-claude')
    mock.timers.tick(1000)
    assert.equal(agent.status, 'reconnecting')
    assert.equal(ws.closedWith, 4000)
    agent.destroy()
  } finally {
    mock.timers.reset()
  }
})

test('heartbeat: a ping unanswered within pongTimeoutMs drops the socket (a node lost without a reset)', async () => {
  const { agent, ws } = await connected() // (its waits use real timers)
  mock.timers.enable({ apis: ['setInterval', 'setTimeout'] })
  try {
    ws.frame({ t: 'hello-ack', lapVersion: 2, minClientVersion: 2, heartbeatMs: 15000 })
    mock.timers.tick(15000)
    for (let i = 0; i < 3; i++) { // pings answered just in time keep the socket
      mock.timers.tick(4999)
      ws.frame({ t: 'pong', at: i })
      mock.timers.tick(10001)
      assert.equal(agent.status, 'pending-claude', `after answered ping ${i + 1}`)
    }
    assert.equal(ws.frames('ping').length, 4)
    mock.timers.tick(4999)
    assert.equal(agent.status, 'pending-claude', 'before the pong timeout')
    mock.timers.tick(1)
    assert.equal(agent.status, 'reconnecting', 'at the pong timeout, not two heartbeats later')
    assert.equal(ws.closedWith, 4000)
    agent.destroy()
  } finally {
    mock.timers.reset()
  }
})

test('a hidden page\'s drain wait runs on a worker timer (its own timers fire once a second at best)', async () => {
  // The fake worker answers at once; the page's setTimeout (5 s here) is
  // what a hidden page would wait for.
  await withFakeWorker(async () => {
    const document = { visibilityState: 'visible', addEventListener: () => {}, removeEventListener: () => {} }
    const { agent, ws } = await connected({ document })
    let r = await rpc(ws, 'send_message', { msg: { type: 'addTask', title: 'Shown' }, drainQuietMs: 10 })
    assert.equal(r.reply.result.status, 'dispatched')
    assert.equal(FakeWorker.made.length, 0, 'a shown page needs no worker')

    document.visibilityState = 'hidden'
    r = await rpc(ws, 'send_message', { msg: { type: 'addTask', title: 'Hidden' }, drainQuietMs: 5000 })
    assert.equal(r.reply.result.status, 'dispatched')
    assert.equal(FakeWorker.made.length, 1)
    assert.deepEqual(FakeWorker.made[0].posted.map((m) => m[1]), [5000])
    r = await rpc(ws, 'send_message', { msg: { type: 'addTask', title: 'Hidden 2' }, drainQuietMs: 5000 })
    assert.equal(FakeWorker.made.length, 1, 'one worker, made on first need')
    agent.destroy()
    assert.equal(FakeWorker.made[0].terminated, true)
  })
})

test('heartbeat: a page shown again checks its socket at once (after a sleep the socket may be dead)', async () => {
  const { handlers, target } = listenerTarget()
  const document = { visibilityState: 'hidden', ...target }
  const { agent, ws } = await connected({ document })
  mock.timers.enable({ apis: ['setInterval', 'setTimeout'] })
  try {
    ws.frame({ t: 'hello-ack', lapVersion: 2, minClientVersion: 2, heartbeatMs: 15000 })
    document.visibilityState = 'visible'
    handlers.visibilitychange()
    assert.equal(ws.frames('ping').length, 1, 'a ping as the page is shown, not 15 s later')
    ws.frame({ t: 'pong', at: 1 })
    mock.timers.tick(5000)
    assert.equal(agent.status, 'pending-claude', 'answered: the socket stays')

    document.visibilityState = 'hidden'
    handlers.visibilitychange()
    assert.equal(ws.frames('ping').length, 1, 'hiding the page sends no ping')
    document.visibilityState = 'visible'
    handlers.visibilitychange()
    assert.equal(ws.frames('ping').length, 2)
    mock.timers.tick(4999)
    assert.equal(agent.status, 'pending-claude')
    mock.timers.tick(1)
    assert.equal(agent.status, 'reconnecting', 'unanswered within the pong timeout: dropped')
    assert.equal(ws.closedWith, 4000)
    agent.destroy()
  } finally {
    mock.timers.reset()
  }
})

test('online: a tab waiting out its reconnect backoff tries at once when the network is back', async () => {
  const { handlers, target: window } = listenerTarget()
  const { agent, ws } = await connected({ window })
  mock.timers.enable({ apis: ['setTimeout', 'setInterval'] })
  try {
    ws.drop(1006)
    assert.equal(agent.status, 'reconnecting')
    assert.equal(FakeWS.all.length, 1, 'the backoff holds the next try')
    handlers.online()
    assert.equal(FakeWS.all.length, 2, 'a new socket as the network comes back')
    agent.destroy()
    assert.equal(handlers.online, undefined, 'destroy removes the listener')
  } finally {
    mock.timers.reset()
  }
})

test('heartbeat: in a hidden page the pong of an urgent check is timed on the worker (the page\'s timers may run once a minute)', async () => {
  await withFakeWorker(async () => {
    const { handlers, target: window } = listenerTarget()
    const document = { visibilityState: 'hidden', addEventListener: () => {}, removeEventListener: () => {} }
    const { agent, ws } = await connected({ document, window })
    mock.timers.enable({ apis: ['setInterval', 'setTimeout'] })
    try {
      ws.frame({ t: 'hello-ack', lapVersion: 2, minClientVersion: 2, heartbeatMs: 15000 })
      // The heartbeat's own pings make no worker: their pongs are timed on
      // the page's timers.
      mock.timers.tick(15000)
      assert.equal(ws.frames('ping').length, 1)
      ws.frame({ t: 'pong', at: 1 })
      mock.timers.tick(15000)
      ws.frame({ t: 'pong', at: 2 })
      assert.equal(FakeWorker.made.length, 0, 'no worker for the heartbeat alone')
      handlers.online() // the network is back: the open socket is checked
      assert.equal(ws.frames('ping').length, 3)
      assert.equal(FakeWorker.made.length, 1)
      assert.deepEqual(FakeWorker.made[0].posted.map((m) => m[1]), [5000])
      // The page's own timers do not move (a throttled hidden page); the
      // worker's does (the fake answers at once).
      await new Promise((resolve) => setImmediate(resolve)) // (setTimeout is mocked)
      assert.equal(agent.status, 'reconnecting', 'dropped at the pong timeout, by the worker\'s timer')
      assert.equal(ws.closedWith, 4000)
      agent.destroy()
    } finally {
      mock.timers.reset()
    }
  })
})

test('visibility: hello carries it, changes send a visibility frame', async () => {
  const { handlers, target } = listenerTarget()
  const document = { visibilityState: 'hidden', ...target }
  const { agent, ws } = await connected({ document })
  assert.equal(ws.frames('hello')[0].visible, false)
  document.visibilityState = 'visible'
  handlers.visibilitychange()
  assert.deepEqual(ws.frames('visibility'), [{ t: 'visibility', visible: true }])
  agent.destroy()
  assert.equal(handlers.visibilitychange, undefined, 'destroy removes the listener')
})

test('would_dispatch with a pure reducer predicts without committing', async () => {
  const reducer = (s, msg) => {
    if (msg.type === 'addTask') return { ...s, tasks: [...s.tasks, { title: msg.title }] }
    if (msg.type === 'save') throw new Error('not pure')
    return s
  }
  const { agent, ws, store } = await connected({ reducer })
  let r = await rpc(ws, 'would_dispatch', { msg: { type: 'addTask', title: 'x' } })
  assert.deepEqual(r.reply.result, { status: 'predicted', stateDiff: [{ op: 'add', path: '/tasks/0', value: { title: 'x' } }], effects: [] })
  assert.deepEqual(store.get().tasks, [], 'nothing committed')
  r = await rpc(ws, 'would_dispatch', { msg: { type: 'save' } })
  assert.equal(r.reply.result.status, 'reducer-threw')
  assert.equal(r.reply.result.message, 'not pure')
  r = await rpc(ws, 'would_dispatch', { msg: { type: 'addTask', title: '' } })
  assert.equal(r.reply.result.reason, 'schema-mismatch')
  assert.deepEqual(r.reply.result.errors[0], { path: 'title', code: 'validates-failed', message: 'must be at least 1 characters', pointer: '/title' },
    "the reference runtime's shape: reference paths and codes")
  agent.destroy()
})

test('a malformed rpc frame gets schema-error; non-JSON frames are ignored', async () => {
  const { agent, ws } = await connected()
  ws.frame({ t: 'rpc', id: 'm1' })
  assert.deepEqual(ws.sent.at(-1), { t: 'rpc-error', id: 'm1', code: 'schema-error', detail: 'rpc frame needs id and tool' })
  ws.onmessage({ data: 'not json' })
  ws.frame({ nope: 1 })
  assert.equal(agent.status, 'pending-claude')
  agent.destroy()
})

test('stats: rpc count and time inside lapd.js, without the app handler and the drain wait', async (t) => {
  // A fake high-resolution clock that only app code advances: the handlers
  // (excluded from the cost) and context() (counted: observe calls it while
  // building the reply, like any other work the tab does for an rpc).
  let fake = 1000
  t.mock.method(globalThis.performance, 'now', () => fake)
  let ctxCost = 0
  const { agent, ws } = await connected({
    actions: {
      slow: { intent: 'Slow handler', handler: () => { fake += 50 } },
      wait: { intent: 'Async effect', handler: () => new Promise((res) => setTimeout(() => { fake += 20; res() }, 5)) },
    },
    context: () => { fake += ctxCost; return { summary: 'x' } },
  })
  assert.deepEqual(agent.stats(), { rpcCount: 0, rpcHandleMsTotal: 0, rpcHandleMsP50: 0 })
  await rpc(ws, 'send_message', { msg: { type: 'slow' }, drainQuietMs: 0 })
  await rpc(ws, 'send_message', { msg: { type: 'wait' }, drainQuietMs: 1 })
  assert.equal(fake, 1070)
  assert.deepEqual(agent.stats(), { rpcCount: 2, rpcHandleMsTotal: 0, rpcHandleMsP50: 0 })

  ctxCost = 3
  await rpc(ws, 'observe')
  assert.deepEqual(agent.stats(), { rpcCount: 3, rpcHandleMsTotal: 3, rpcHandleMsP50: 0 }) // samples 0, 0, 3
  await rpc(ws, 'observe')
  assert.deepEqual(agent.stats(), { rpcCount: 4, rpcHandleMsTotal: 6, rpcHandleMsP50: 0 }) // lower median of 0, 0, 3, 3
  await rpc(ws, 'observe')
  assert.deepEqual(agent.stats(), { rpcCount: 5, rpcHandleMsTotal: 9, rpcHandleMsP50: 3 })
  agent.destroy()
})

test('stats: real clock, errors and malformed frames count too', async () => {
  const { agent, ws } = await connected()
  const t0 = performance.now()
  await rpc(ws, 'send_message', { msg: { type: 'save' }, drainQuietMs: 10 }) // ≥ 30 ms in the app
  const wall = performance.now() - t0
  await rpc(ws, 'query_state', { path: 1 }) // rpc-error
  ws.frame({ t: 'rpc', id: 'm1' }) // malformed
  await until(() => agent.stats().rpcCount === 3, 'three rpcs counted')
  const s = agent.stats()
  assert.ok(wall >= 30, `wall ${wall}`)
  assert.ok(s.rpcHandleMsTotal < wall - 20, `lapd.js cost ${s.rpcHandleMsTotal} ms must exclude the ≥ 30 ms save (wall ${wall} ms)`)
  assert.ok(s.rpcHandleMsP50 <= s.rpcHandleMsTotal)
  agent.destroy()
})

test('the panel\'s words: summarize in approvals and log notes; log-show is shown, not echoed', async () => {
  const env = await connected({
    actions: {
      addTask: { intent: 'Add a task', summarize: ({ title }) => `Add "${title}"`, handler: () => {} },
      clearAll: { intent: 'Delete every task', requiresConfirm: true, summarize: (_, s) => `Delete every task (${s.tasks.length} tasks)`, handler: () => {} },
    },
  })
  const { ws, agent } = env
  const { reply, log } = await rpc(ws, 'send_message', { msg: { type: 'clearAll' } })
  const cid = reply.result.confirmId
  assert.equal(log.kind, 'proposed')
  assert.equal(log.confirmId, cid, 'the proposal names its confirmId (the feed folds the outcome into it)')
  assert.equal(log.summary, undefined, 'panel words stay off the wire')
  assert.equal(agent.pendingConfirms()[0].summary, 'Delete every task (0 tasks)')
  env.store.set({ ...env.store.get(), tasks: [1, 2] })
  assert.equal(agent.pendingConfirms()[0].summary, 'Delete every task (2 tasks)', 'computed against the current state')
  agent.reject(cid)
  const out = agent.log().at(-1)
  assert.equal(out.kind, 'rejected')
  assert.equal(out.confirmId, cid)
  const before = ws.frames('log-append').length
  ws.frame({ t: 'log-show', entry: { id: 'blocked-1', at: 1, kind: 'blocked', variant: 'reset', intent: 'Reset', detail: 'human-only: ask them' } })
  assert.equal(agent.log().at(-1).id, 'blocked-1')
  assert.equal(ws.frames('log-append').length, before, 'log-show is not echoed')
  agent.destroy()
})
