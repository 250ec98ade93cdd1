// The panel's words: describeMsg, relativeTime and feedItems are pure, so the
// feed's wording is tested here; the panel itself runs in the browser E2E.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { describeMsg, relativeTime, feedItems } from '../lapd.js'

const actions = {
  addTask: { intent: 'Add a task to a column (default todo)', summarize: ({ title }) => `Add "${title}"` },
  clearAll: { intent: 'Delete every task', summarize: (_, s) => `Delete every task (${s.tasks.length} tasks)` },
  toggle: { intent: 'Mark a task done' },
  broken: { intent: 'Broken summary', summarize: () => { throw new Error('nope') } },
  empty: { intent: 'Empty summary', summarize: () => '  ' },
}

test('describeMsg: summarize(msg, state), else the intent and plain payload values', () => {
  const state = { tasks: [1, 2, 3, 4, 5, 6] }
  assert.equal(describeMsg(actions, { type: 'clearAll' }, state), 'Delete every task (6 tasks)')
  assert.equal(describeMsg(actions, { type: 'addTask', title: 'Buy milk' }, state), 'Add "Buy milk"')
  assert.equal(describeMsg(actions, { type: 'toggle', id: 2 }, state), 'Mark a task done: id 2')
  assert.equal(describeMsg(actions, { type: 'toggle', note: 'x', tags: ['a'], nested: { a: 1 } }, state), 'Mark a task done: "x"')
  assert.equal(describeMsg(actions, { type: 'broken', n: 1 }, state), 'Broken summary: n 1', 'a throwing summarize falls back')
  assert.equal(describeMsg(actions, { type: 'empty' }, state), 'Empty summary', 'a blank summarize falls back')
  assert.equal(describeMsg(actions, { type: 'unknown' }, state), 'unknown')
  assert.equal(describeMsg(null, { type: 'x' }, state, 'Fallback intent'), 'Fallback intent')
  assert.equal(describeMsg(actions, null, state, 'Fallback'), 'Fallback')
  const long = describeMsg({ a: { summarize: () => 'y'.repeat(500) } }, { type: 'a' }, state)
  assert.equal(long.length, 200)
  assert.ok(long.endsWith('…'))
})

test('relativeTime', () => {
  const now = 1_000_000_000
  assert.equal(relativeTime(now - 3000, now), 'just now')
  assert.equal(relativeTime(now + 5000, now), 'just now', 'a clock slightly ahead is not in the future')
  assert.equal(relativeTime(now - 42_000, now), '42 s ago')
  assert.equal(relativeTime(now - 3 * 60_000, now), '3 min ago')
  assert.equal(relativeTime(now - 2 * 3600_000, now), '2 h ago')
  assert.match(relativeTime(now - 3 * 86400_000, now), /^\d{4}-\d{2}-\d{2}$/)
  assert.equal(relativeTime(undefined, now), '')
})

test('feedItems: the human\'s words, newest first, paths only in detail', () => {
  const notes = new Map([['r2', { summary: 'Add "Buy milk" to todo' }]])
  const items = feedItems([
    { id: 'r1', at: 1, kind: 'read', intent: 'Observe the app' },
    { id: 'r1b', at: 2, kind: 'read', intent: 'Observe the app' },
    { id: 'r2', at: 3, kind: 'dispatched', intent: 'Add a task to a column (default todo)', stateDiff: [{ op: 'replace', path: '/nextId', value: 5 }, { op: 'add', path: '/tasks/3', value: {} }] },
    { id: 'n1', at: 4, kind: 'narrate', intent: 'Agent narrated', detail: 'Now the report.' },
    { id: 'b1', at: 5, kind: 'blocked', variant: 'resetDemo', intent: 'Reset the demo board', detail: 'human-only: resetDemo can only be done by the human' },
    { id: 'e1', at: 6, kind: 'error', intent: 'Save', detail: 'HTTP 500' },
  ], notes)
  assert.deepEqual(items.map((i) => `${i.label}|${i.text}`), [
    'Failed|Save',
    'Blocked|Reset the demo board: only you can do this, in the app',
    'AI|Now the report.',
    'Done|Add "Buy milk" to todo',
    '|Looked at the app',
  ])
  assert.equal(items[4].count, 2, 'consecutive reads are one line')
  assert.equal(items[4].at, 2)
  assert.equal(items[3].detail, '/nextId changed\n/tasks/3 added')
  assert.equal(items[1].detail, 'human-only: resetDemo can only be done by the human')
  for (const it of items) assert.ok(!/\//.test(`${it.label} ${it.text}`), `no JSON path in ${it.text}`)
})

test('feedItems: an approval is one line, updated in place', () => {
  const notes = new Map([['p1', { summary: 'Delete every task (6 tasks)' }], ['p2', { summary: 'Delete every task (0 tasks)' }]])
  const proposed = [
    { id: 'p1', at: 10, kind: 'proposed', intent: 'Delete every task', confirmId: 'c1' },
    { id: 'p2', at: 11, kind: 'proposed', intent: 'Delete every task', confirmId: 'c2' },
  ]
  assert.deepEqual(feedItems(proposed, notes).map((i) => i.label), ['Waiting for your approval', 'Waiting for your approval'])
  const later = [...proposed,
    { id: 'x', at: 12, kind: 'read', intent: 'Observe the app' },
    { id: 'confirm-c1', at: 13, kind: 'confirmed', confirmId: 'c1', intent: 'Delete every task', detail: 'approved by the user' },
    { id: 'confirm-c2', at: 14, kind: 'rejected', confirmId: 'c2', intent: 'Delete every task', detail: 'expired (timeout)' }]
  const items = feedItems(later, notes)
  assert.deepEqual(items.map((i) => `${i.label}|${i.text}|${i.at}`), [
    '|Looked at the app|12',
    'Expired, not done|Delete every task (0 tasks)|14',
    'Approved by you|Delete every task (6 tasks)|13',
  ])
  // The answer's own words win: the state may have changed while the card
  // was up, and the line says what was done then.
  const answeredLater = feedItems(later, new Map([...notes, ['confirm-c1', { summary: 'Delete every task (7 tasks)' }]]))
  assert.equal(answeredLater.at(-1).text, 'Delete every task (7 tasks)')
  // An outcome whose proposal left the ring (or came before a reload) stands alone.
  const alone = feedItems([{ id: 'confirm-c3', at: 20, kind: 'rejected', confirmId: 'c3', intent: 'Delete every task', detail: 'rejected by the user' }])
  assert.deepEqual(alone.map((i) => `${i.label}|${i.text}`), ['Rejected by you|Delete every task'])
})

test("validatePayload codes and referencePath: the reference runtime's words for schema errors", async () => {
  const { validatePayload, referencePath } = await import('../lapd.js')
  const schema = {
    type: 'object', required: ['title'], additionalProperties: false,
    properties: { title: { type: 'string', minLength: 2 }, column: { enum: ['todo', 'done'] }, tags: { type: 'array', items: { type: 'object' } }, meta: { type: 'object' } },
  }
  const codes = (v) => validatePayload(schema, v).map((e) => `${e.path} ${e.code}`)
  assert.deepEqual(codes({}), ['/title missing'])
  assert.deepEqual(codes({ title: 'a' }), ['/title validates-failed'])
  assert.deepEqual(codes({ title: 7 }), ['/title wrong-type'])
  assert.deepEqual(codes({ title: 'ab', column: 'later' }), ['/column not-in-enum'])
  assert.deepEqual(codes({ title: 'ab', tags: 'x' }), ['/tags not-array'])
  assert.deepEqual(codes({ title: 'ab', tags: [1] }), ['/tags/0 not-object'])
  assert.deepEqual(codes({ title: 'ab', meta: 1 }), ['/meta not-object'])
  assert.deepEqual(codes({ title: 'ab', extra: 1 }), ['/extra unexpected-field'])
  const msg = { type: 't', cells: [{ value: 1 }], 'a.b': { c: [[1]] }, 'x/y': 1 }
  for (const [ptr, want] of [['', ''], ['/title', 'title'], ['/cells/0/value', 'cells[0].value'], ['/cells/9', 'cells[9]'],
    ['/a.b/c/0/0', '["a.b"].c[0][0]'], ['/x~1y', 'x/y'], ['/missing/deeper', 'missing.deeper']]) {
    assert.equal(referencePath(ptr, msg), want, ptr)
  }
})
