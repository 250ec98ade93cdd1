import { test } from 'node:test'
import assert from 'node:assert/strict'
import {
  computeStateDiff, resolvePointer, backoffDelay, nextState, initialConnState, connectLine,
  validatePayload, summarizeDiff, toWire, fromWire, msgDetail, escapePointerSegment,
} from '../lapd.js'

test('importing the module touches no browser globals', () => {
  assert.equal(typeof globalThis.window, 'undefined')
  assert.equal(typeof globalThis.document, 'undefined')
})

test('backoff: 1,2,4,8,16,30,30 s', () => {
  assert.deepEqual([0, 1, 2, 3, 4, 5, 6, 50, -1].map(backoffDelay), [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 1000])
})

test('connect line carries url and token for the MCP parser', () => {
  const l = connectLine('https://app.example/agent/lap/v1', 'agt_abc')
  assert.equal(l, 'Connect to my app with lapd: connect_session url=https://app.example/agent/lap/v1 token=agt_abc')
  assert.match(l, /https?:\/\/\S+/)
  assert.match(l, /agt_[A-Za-z0-9_-]+/)
})

const run = (events, from = initialConnState()) => events.reduce((s, e) => nextState(s, e), from)
const types = (s) => s.effects.map((e) => e.type)

test('state machine transitions', async (t) => {
  const cases = [
    { name: 'mint from idle', from: 'idle', ev: { type: 'mint' }, to: 'minting', effects: ['mint'] },
    { name: 'mint ignored while active', from: 'active', ev: { type: 'mint' }, to: 'active', effects: [] },
    { name: 'mint ok', from: 'minting', ev: { type: 'mint-ok' }, to: 'pending-claude', effects: ['persist', 'open'] },
    { name: 'mint failed', from: 'minting', ev: { type: 'mint-failed', code: 'http-401' }, to: 'error', effects: [] },
    { name: 'restore from idle', from: 'idle', ev: { type: 'restore' }, to: 'pending-claude', effects: ['open'] },
    { name: 'restore ignored when active', from: 'active', ev: { type: 'restore' }, to: 'active', effects: [] },
    { name: 'ws-opened resets reconnecting', from: 'reconnecting', ev: { type: 'ws-opened' }, to: 'pending-claude', effects: [] },
    { name: 'ws-opened keeps active', from: 'active', ev: { type: 'ws-opened' }, to: 'active', effects: [] },
    { name: 'activated', from: 'pending-claude', ev: { type: 'activated' }, to: 'active', effects: [] },
    { name: 'activated ignored when idle', from: 'idle', ev: { type: 'activated' }, to: 'idle', effects: [] },
    { name: 'close without token → idle', from: 'active', ev: { type: 'ws-closed', hasToken: false }, to: 'idle', effects: [] },
    { name: 'close when active → reconnecting', from: 'active', ev: { type: 'ws-closed', hasToken: true }, to: 'reconnecting', effects: ['schedule'] },
    { name: 'close when failed stays', from: 'failed', ev: { type: 'ws-closed', hasToken: true }, to: 'failed', effects: [] },
    { name: 'refused → error, session cleared, no retry', from: 'reconnecting', ev: { type: 'refused', code: 'revoked' }, to: 'error', effects: ['clear', 'close'] },
    { name: 'revoked → idle', from: 'active', ev: { type: 'revoked' }, to: 'idle', effects: ['clear', 'close'] },
    { name: 'final close → error', from: 'active', ev: { type: 'close-final', code: 'superseded' }, to: 'error', effects: ['close'] },
    { name: 'disconnect', from: 'active', ev: { type: 'disconnect' }, to: 'idle', effects: ['revoke', 'clear', 'close'] },
    { name: 'revoke failed after disconnect stays idle', from: 'idle', ev: { type: 'revoke-failed' }, to: 'idle', effects: [] },
    { name: 'revoke failed after a new connect is ignored', from: 'minting', ev: { type: 'revoke-failed' }, to: 'minting', effects: [] },
    { name: 'resume ok', from: 'failed', ev: { type: 'resume-ok' }, to: 'pending-claude', effects: ['close', 'persist', 'open'] },
  ]
  for (const c of cases) {
    await t.test(c.name, () => {
      const s = nextState({ ...initialConnState(), status: c.from }, c.ev)
      assert.equal(s.status, c.to)
      assert.deepEqual(types(s), c.effects)
    })
  }
})

test('state machine: a revoke that did not reach lapd is said, not swallowed', () => {
  const s = run([{ type: 'mint' }, { type: 'mint-ok' }, { type: 'activated' }, { type: 'disconnect' }, { type: 'revoke-failed' }])
  assert.equal(s.status, 'idle')
  assert.match(s.message, /could not be reached/)
  assert.equal(nextState(s, { type: 'mint' }).message, null)
})

test('state machine: error carries the code', () => {
  const s = run([{ type: 'mint' }, { type: 'mint-failed', code: 'http-429', detail: 'slow down' }])
  assert.deepEqual(s.error, { code: 'http-429', detail: 'slow down' })
  const r = nextState({ ...initialConnState(), status: 'pending-claude' }, { type: 'refused', code: 'auth-failed' })
  assert.equal(r.error.code, 'auth-failed')
})

test('state machine: backoff grows per attempt and gives up after 5 minutes', () => {
  let s = run([{ type: 'mint' }, { type: 'mint-ok' }, { type: 'activated' }, { type: 'ws-closed', hasToken: true }])
  assert.equal(s.status, 'reconnecting')
  const delays = []
  for (let i = 0; i < 30 && s.status === 'reconnecting'; i++) {
    const sched = s.effects.find((e) => e.type === 'schedule')
    delays.push(sched.delayMs)
    s = nextState(s, { type: 'reconnect-attempt', elapsedMs: sched.delayMs })
    if (s.status !== 'reconnecting') break
    assert.deepEqual(types(s), ['open'])
    s = nextState(s, { type: 'ws-closed', hasToken: true })
  }
  assert.deepEqual(delays.slice(0, 7), [1000, 2000, 4000, 8000, 16000, 30000, 30000])
  assert.equal(s.status, 'failed')
  assert.ok(s.elapsedMs >= 300000)
  // A successful open resets the counters.
  let r = run([{ type: 'mint' }, { type: 'mint-ok' }, { type: 'ws-closed', hasToken: true }, { type: 'reconnect-attempt', elapsedMs: 1000 }, { type: 'ws-closed', hasToken: true }])
  assert.equal(r.effects[0].delayMs, 2000)
  r = nextState(r, { type: 'ws-opened' })
  assert.equal(r.attempt, 0)
  assert.equal(r.elapsedMs, 0)
})

test('lenient pointer (get_state)', async (t) => {
  const st = { a: { b: [10, 20, { c: 'x' }] }, 'x/y': 1, 'm~n': 2, '': 'empty' }
  const cases = [
    ['', st], ['/', st], [null, st], [undefined, st], ['/a/b/1', 20], ['a/b/1', 20], ['//a//b/2/c', 'x'],
    ['/x~1y', 1], ['/m~0n', 2], ['/nope', undefined], ['/a/b/9', undefined], ['/a/b/x', undefined], ['/a/b/1/z', undefined],
    ['/toString', undefined], ['/a/b/01', undefined],
  ]
  for (const [p, want] of cases) await t.test(String(p), () => assert.deepEqual(resolvePointer(st, p), want))
})

test('strict RFC 6901 pointer (query_state)', async (t) => {
  const doc = { foo: ['bar', 'baz'], '': 0, 'a/b': 1, 'c%d': 2, 'e^f': 3, 'g|h': 4, 'i\\j': 5, 'k"l': 6, ' ': 7, 'm~n': 8, n: null }
  // RFC 6901 §5 examples.
  const ok = [['', doc], ['/foo', ['bar', 'baz']], ['/foo/0', 'bar'], ['/', 0], ['/a~1b', 1], ['/c%d', 2], ['/e^f', 3], ['/g|h', 4], ['/i\\j', 5], ['/k"l', 6], ['/ ', 7], ['/m~0n', 8], ['/n', null]]
  for (const [p, v] of ok) await t.test(`found ${JSON.stringify(p)}`, () => assert.deepEqual(resolvePointer(doc, p, { strict: true }), { found: true, value: v }))
  const bad = ['foo', '/foo/2', '/foo/-', '/foo/01', '/missing', '/n/x', '/foo/0/x', '/a~2b', '/a~']
  for (const p of bad) {
    await t.test(`not found ${p}`, () => {
      const r = resolvePointer(doc, p, { strict: true })
      assert.equal(r.found, false)
      assert.equal(typeof r.detail, 'string')
    })
  }
  assert.equal(resolvePointer(doc, 5, { strict: true }).found, false)
})

test('stateDiff', async (t) => {
  const cases = [
    { name: 'identical', a: { x: 1 }, b: { x: 1 }, want: [] },
    { name: 'root primitive', a: 1, b: 2, want: [{ op: 'replace', path: '', value: 2 }] },
    { name: 'removes first, then adds and recursion in key order', a: { b: 1, z: 1, d: { e: 1 } }, b: { a: 1, b: 2, d: { e: 2 } },
      want: [{ op: 'remove', path: '/z' }, { op: 'add', path: '/a', value: 1 }, { op: 'replace', path: '/b', value: 2 }, { op: 'replace', path: '/d/e', value: 2 }] },
    { name: 'escaping', a: {}, b: { 'a/b': 1, 'c~d': 2 }, want: [{ op: 'add', path: '/a~1b', value: 1 }, { op: 'add', path: '/c~0d', value: 2 }] },
    { name: 'array shrink removes from the end', a: [1, 2, 3, 4], b: [9, 2], want: [{ op: 'replace', path: '/0', value: 9 }, { op: 'remove', path: '/3' }, { op: 'remove', path: '/2' }] },
    { name: 'array grow', a: [1], b: [1, 2, 3], want: [{ op: 'add', path: '/1', value: 2 }, { op: 'add', path: '/2', value: 3 }] },
    { name: 'array ↔ object is one replace', a: { l: [1] }, b: { l: { 0: 1 } }, want: [{ op: 'replace', path: '/l', value: { 0: 1 } }] },
    { name: 'primitive → object', a: { v: null }, b: { v: { k: 1 } }, want: [{ op: 'replace', path: '/v', value: { k: 1 } }] },
    { name: 'nested in array', a: { t: [{ done: false }] }, b: { t: [{ done: true }] }, want: [{ op: 'replace', path: '/t/0/done', value: true }] },
  ]
  for (const c of cases) await t.test(c.name, () => assert.deepEqual(computeStateDiff(c.a, c.b), c.want))
  await t.test('shared subtrees short-circuit', () => {
    const shared = { big: Array.from({ length: 5 }, (_, i) => ({ i })) }
    assert.deepEqual(computeStateDiff({ s: shared, n: 1 }, { s: shared, n: 2 }), [{ op: 'replace', path: '/n', value: 2 }])
  })
})

test('summarizeDiff', () => {
  assert.equal(summarizeDiff([]), 'no state change')
  assert.equal(summarizeDiff([{ op: 'add', path: '/todos/2', value: 1 }]), '1 change: /todos/2 added')
  assert.equal(summarizeDiff([{ op: 'add', path: '/a' }, { op: 'remove', path: '/b' }, { op: 'replace', path: '' }]), '3 changes: /a added, /b removed…')
})

test('payload validation subset', async (t) => {
  const schema = {
    type: 'object', required: ['title'], additionalProperties: false,
    properties: {
      title: { type: 'string', minLength: 1, maxLength: 5 },
      column: { enum: ['todo', 'doing', 'done'] },
      n: { type: 'integer', minimum: 1, maximum: 3 },
      tags: { type: 'array', items: { type: 'string' }, maxItems: 2 },
      meta: { type: 'object', properties: { 'a/b': { type: 'boolean' } } },
    },
  }
  const cases = [
    { name: 'valid', v: { title: 'ok', column: 'todo', n: 2, tags: ['x'] }, want: [] },
    { name: 'missing required', v: {}, want: ['/title'] },
    { name: 'wrong type', v: { title: 3 }, want: ['/title'] },
    { name: 'too short', v: { title: '' }, want: ['/title'] },
    { name: 'too long', v: { title: 'abcdef' }, want: ['/title'] },
    { name: 'enum', v: { title: 'a', column: 'later' }, want: ['/column'] },
    { name: 'integer', v: { title: 'a', n: 1.5 }, want: ['/n'] },
    { name: 'minimum', v: { title: 'a', n: 0 }, want: ['/n'] },
    { name: 'maximum', v: { title: 'a', n: 4 }, want: ['/n'] },
    { name: 'items', v: { title: 'a', tags: ['x', 2] }, want: ['/tags/1'] },
    { name: 'maxItems', v: { title: 'a', tags: ['x', 'y', 'z'] }, want: ['/tags'] },
    { name: 'additionalProperties false', v: { title: 'a', extra: 1 }, want: ['/extra'] },
    { name: 'nested escaping', v: { title: 'a', meta: { 'a/b': 'no' } }, want: ['/meta/a~1b'] },
    { name: 'not an object', v: [], want: [''] },
  ]
  for (const c of cases) {
    await t.test(c.name, () => {
      const errs = validatePayload(schema, c.v)
      assert.deepEqual(errs.map((e) => e.path), c.want, JSON.stringify(errs))
      for (const e of errs) assert.equal(typeof e.message, 'string')
    })
  }
  await t.test('errors are capped', () => {
    const s = { type: 'array', items: { type: 'string' } }
    assert.equal(validatePayload(s, Array(100).fill(1)).length, 20)
  })
  await t.test('no schema / true accepts anything', () => {
    assert.deepEqual(validatePayload(undefined, 1), [])
    assert.deepEqual(validatePayload(true, 1), [])
    assert.equal(validatePayload(false, 1).length, 1)
  })
})

test('wire codecs', () => {
  const d = new Date('2026-01-02T03:04:05.000Z')
  const w = toWire({ d, f() {}, u: undefined, n: 1 })
  assert.deepEqual(w, { d: { __codec: 'iso-date', wire: '2026-01-02T03:04:05.000Z' }, n: 1 })
  const back = fromWire(w)
  assert.ok(back.d instanceof Date)
  assert.equal(back.d.getTime(), d.getTime())
  const evil = fromWire(JSON.parse('{"__proto__":{"polluted":1},"ok":1}'))
  assert.equal({}.polluted, undefined)
  assert.deepEqual(Object.keys(evil), ['ok'])
})

test('msgDetail', () => {
  assert.equal(msgDetail({ type: 'x', title: 'Buy milk', tags: [1, 2], meta: { a: 1, b: 2 }, more: 1 }), 'title="Buy milk" tags=[2] meta={a,b}')
  assert.equal(msgDetail({ type: 'x', s: 'a'.repeat(40) }), `s="${'a'.repeat(29)}…`)
  assert.equal(escapePointerSegment('a~/b'), 'a~0~1b')
})
