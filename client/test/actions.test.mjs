import { test } from 'node:test'
import assert from 'node:assert/strict'
import { listActions, payloadHint, fieldHints, buildPolicy, buildMsgSchema, gateMessage, outline, queryDom } from '../lapd.js'

const actions = {
  addTask: {
    intent: 'Add a task',
    schema: {
      type: 'object', required: ['title', 'column'], additionalProperties: false,
      properties: {
        title: { type: 'string', minLength: 1, description: 'Short title' },
        column: { enum: ['todo', 'doing', 'done'], description: 'Where it goes' },
        note: { type: 'string' },
        meta: { type: 'object', properties: { pri: { type: 'integer', minimum: 1, description: 'Priority' } } },
      },
    },
    examples: [{ type: 'addTask', title: 'Buy milk', column: 'todo' }],
    alwaysAffordable: true,
    handler() {},
  },
  toggle: { intent: 'Toggle', schema: { type: 'object', required: ['id'], properties: { id: { type: 'integer' } } }, available: (s) => (s.tasks.length ? true : 'there are no tasks') },
  clearAll: { intent: 'Delete every task', requiresConfirm: true, warning: 'irreversible' },
  reset: { intent: 'Reset the demo', humanOnly: true },
  peek: { intent: 'Agent-only peek', agentOnly: true, emits: ['toggle'] },
}

test('list_actions shaping', () => {
  const list = listActions(actions, { tasks: [] }, { affordances: ['clearAll'], visible: (v) => v === 'peek' })
  assert.deepEqual(list.map((a) => a.variant), ['addTask', 'toggle', 'clearAll', 'peek'], 'humanOnly never listed')
  const [add, toggle, clear, peek] = list
  assert.deepEqual(add, {
    variant: 'addTask', intent: 'Add a task', requiresConfirm: false, dispatchMode: 'shared', source: 'always-affordable',
    selectorHint: null, payloadHint: { type: 'addTask', title: '…', column: 'todo' }, warning: null,
    examples: [{ type: 'addTask', title: 'Buy milk', column: 'todo' }], emits: [],
    fieldHints: [{ path: 'title', hint: 'Short title' }, { path: 'column', hint: 'Where it goes' }, { path: 'meta.pri', hint: 'Priority' }],
  })
  assert.equal(toggle.available, false)
  assert.equal(toggle.unavailableReason, 'there are no tasks')
  assert.equal(toggle.source, 'schema')
  assert.deepEqual(toggle.payloadHint, { type: 'toggle', id: 0 })
  assert.equal(clear.requiresConfirm, true)
  assert.equal(clear.source, 'binding')
  assert.equal(clear.warning, 'irreversible')
  assert.equal(clear.payloadHint, null)
  assert.equal(peek.dispatchMode, 'agent-only')
  assert.equal(peek.source, 'binding')
  assert.deepEqual(peek.emits, ['toggle'])
  assert.equal('available' in listActions(actions, { tasks: [1] })[1], false)
})

test('payloadHint never uses null placeholders', () => {
  const h = payloadHint('x', { type: 'object', required: ['a', 'b', 'c', 'd'], properties: { a: { type: ['null', 'string'] }, b: { enum: [null, 'x'] }, c: { default: null, type: 'boolean' }, d: { type: 'object', required: ['e'], properties: { e: { type: 'number', minimum: 5 } } } } })
  assert.deepEqual(h, { type: 'x', a: '', b: 'x', c: false, d: { e: 5 } })
  assert.ok(!JSON.stringify(h).includes('null'))
  assert.deepEqual(fieldHints(undefined), [])
})

test('hello.policy has the PROTOCOL.md shape', () => {
  const p = buildPolicy(actions)
  assert.deepEqual(Object.keys(p.variants), ['addTask', 'toggle', 'clearAll', 'reset', 'peek'])
  assert.deepEqual(p.variants.reset, { intent: 'Reset the demo', humanOnly: true })
  assert.deepEqual(p.variants.clearAll, { intent: 'Delete every task', requiresConfirm: true, warning: 'irreversible' })
  assert.equal(p.variants.addTask.alwaysAffordable, true)
  assert.equal(p.variants.addTask.schema, actions.addTask.schema)
  assert.deepEqual(p.variants.addTask.examples, actions.addTask.examples)
  assert.equal(buildPolicy(null), null)
  const ms = buildMsgSchema(actions)
  assert.equal(ms.discriminant, 'type')
  assert.deepEqual(ms.variants.addTask.column, { type: { enum: ['todo', 'doing', 'done'] }, hint: 'Where it goes' })
  assert.deepEqual(ms.variants.addTask.note, { type: 'string', optional: true })
})

test('dispatch gate', async (t) => {
  const cases = [
    { name: 'no type', msg: { title: 'x' }, reason: 'invalid' },
    { name: 'not an object', msg: 'addTask', reason: 'invalid' },
    { name: 'unknown variant', msg: { type: 'nope' }, reason: 'invalid', detail: 'unknown variant: nope' },
    { name: 'human only', msg: { type: 'reset' }, reason: 'human-only' },
    { name: 'schema', msg: { type: 'addTask', title: '' }, reason: 'invalid', errors: ['/column', '/title'] },
    { name: 'ok', msg: { type: 'addTask', title: 'a', column: 'done' }, reason: null },
    { name: 'prototype key is not a variant', msg: { type: 'toString' }, reason: 'invalid' },
  ]
  for (const c of cases) {
    await t.test(c.name, () => {
      const r = gateMessage(actions, c.msg)
      if (c.reason === null) return assert.equal(r, null)
      assert.equal(r.status, 'rejected')
      assert.equal(r.reason, c.reason)
      if (c.detail) assert.equal(r.detail, c.detail)
      if (c.errors) assert.deepEqual(r.errors.map((e) => e.path), c.errors)
    })
  }
  assert.equal(gateMessage(null, { type: 'anything' }), null, 'no actions: the app dispatch decides')
})

// A tiny fake DOM: enough for the walkers.
function h(tag, attrs = {}, ...children) {
  const el = { tagName: tag.toUpperCase(), attributes: [], children: [], _text: '' }
  for (const [k, v] of Object.entries(attrs)) el.attributes.push({ name: k, value: String(v) })
  el.getAttribute = (n) => { const a = el.attributes.find((x) => x.name === n); return a ? a.value : null }
  for (const c of children) { if (typeof c === 'string') el._text += c; else el.children.push(c) }
  Object.defineProperty(el, 'textContent', { get: () => el._text + el.children.map((c) => c.textContent).join(' ') })
  if ('value' in attrs) el.value = attrs.value
  return el
}

test('outline of data-agent zones', () => {
  const body = h('body', {},
    h('header', {}, h('h1', {}, 'Not in a zone')),
    h('main', { 'data-agent': 'board' },
      h('h2', {}, 'Board'),
      h('ul', {}, h('li', {}, 'Task A'), h('li', {}, ''), h('li', {}, 'Task B')),
      h('button', { 'data-agent': 'addTask' }, 'Add'),
      h('button', { disabled: '' }, 'Off'),
      h('input', { 'aria-label': 'Title', value: 'x', type: 'text' }),
      h('input', { type: 'hidden', name: 'csrf', value: 'secret' }),
      h('a', { href: '/help' }, 'Help'),
      h('div', { hidden: '' }, 'hidden'),
      h('script', {}, 'var x')),
    h('button', { 'data-agent': 'save' }, 'Save'),
    h('div', { 'data-lapd-panel': '' }, h('button', { 'data-agent': 'x' }, 'panel')))
  const o = outline(body)
  assert.equal(o.source, 'data-agent')
  assert.deepEqual(o.outline, [
    { kind: 'region', name: 'board', children: [
      { kind: 'heading', level: 2, text: 'Board' },
      { kind: 'list', items: [{ kind: 'item', text: 'Task A' }, { kind: 'item', text: 'Task B' }] },
      { kind: 'button', text: 'Add', disabled: false, actionVariant: 'addTask' },
      { kind: 'button', text: 'Off', disabled: true, actionVariant: null },
      { kind: 'input', label: 'Title', value: 'x', type: 'text' },
      { kind: 'link', text: 'Help', href: '/help' },
    ] },
    { kind: 'button', text: 'Save', disabled: false, actionVariant: 'save' },
  ])
})

test('outline fallback walk is capped', () => {
  const small = h('body', {}, h('h1', {}, 'Hi'), h('div', {}, h('p', {}, 'text')), h('style', {}, 'x{}'))
  assert.deepEqual(outline(small), { outline: [{ kind: 'heading', level: 1, text: 'Hi' }, { kind: 'text', text: 'text' }], source: 'fallback' })
  const many = h('body', {}, ...Array.from({ length: 300 }, (_, i) => h('p', {}, `p${i}`)))
  const o = outline(many)
  assert.equal(o.source, 'truncated')
  assert.equal(o.outline.length, 200)
  let deep = h('p', {}, 'bottom')
  for (let i = 0; i < 12; i++) deep = h('div', {}, deep)
  const d = outline(h('body', {}, deep))
  assert.equal(d.source, 'truncated')
  assert.deepEqual(d.outline, [])
  assert.deepEqual(outline(null), { outline: [], source: 'fallback' })
})

test('query_dom', () => {
  const body = h('body', {}, h('div', {}, h('span', { 'data-agent': 'task', id: 'a' }, ' A '), h('span', { 'data-agent': 'task' }, 'B')), h('i', { 'data-agent': 'other' }, 'C'))
  assert.deepEqual(queryDom(body, 'task'), [{ text: 'A', attrs: { 'data-agent': 'task', id: 'a' }, path: [0, 0] }])
  assert.deepEqual(queryDom(body, 'task', true).map((e) => e.path), [[0, 0], [0, 1]])
  assert.deepEqual(queryDom(body, 'none', true), [])
})
