// Taskboard: the lapd demo app. A tiny store, a render function, and one
// `actions` table used both by the buttons on the page and by the AI (through
// lapd.js). Read it top to bottom: store, actions, agent, rendering.
import { createAgent } from '/agent/client.js'

const COLUMNS = ['todo', 'doing', 'done']
const FILTERS = ['all', 'active', 'done']

function initialBoard() {
  return {
    tasks: [
      { id: 1, title: 'Try the lapd demo', column: 'doing', done: false },
      { id: 2, title: 'Connect an AI from the panel', column: 'todo', done: false },
      { id: 3, title: 'Read the protocol notes', column: 'done', done: true },
    ],
    nextId: 4,
    filter: 'all',
    saving: false,
    dirty: false, // nothing changed since the page loaded
    savedAt: null,
    saveError: null,
  }
}

// ── store: immutable updates, subscribers notified on every commit ──
let state = initialBoard()
const listeners = new Set()
const store = {
  get: () => state,
  set(patch) {
    state = { ...state, ...patch }
    for (const fn of [...listeners]) fn()
  },
  subscribe(fn) { listeners.add(fn); return () => listeners.delete(fn) },
}

function findTask(id) {
  const t = state.tasks.find((x) => x.id === id)
  if (!t) throw new Error(`no task with id ${id}`)
  return t
}
function updateTask(id, patch) {
  findTask(id)
  store.set({ tasks: state.tasks.map((t) => (t.id === id ? { ...t, ...patch } : t)), dirty: true })
}

const id = { type: 'integer', minimum: 1, description: 'Task id (see /tasks in the state)' }
const title = { type: 'string', minLength: 1, maxLength: 120, description: 'Short task title' }
const column = { enum: COLUMNS, description: 'Board column' }
const hasTasks = (s) => (s.tasks.length ? true : 'the board is empty')
// For the panel: an action in the human's words, e.g. Rename "Buy milk" to "Buy oat milk".
const named = (s, id) => { const t = s.tasks.find((x) => x.id === id); return t ? `"${t.title}"` : `task ${id}` }
const plural = (n, one) => `${n} ${one}${n === 1 ? '' : 's'}`

// ── actions: one table for the page and for the AI ──
const actions = {
  addTask: {
    intent: 'Add a task to a column (default todo)',
    schema: { type: 'object', required: ['title'], additionalProperties: false, properties: { title, column } },
    examples: [{ type: 'addTask', title: 'Buy milk' }, { type: 'addTask', title: 'Write tests', column: 'doing' }],
    alwaysAffordable: true,
    summarize: ({ title, column = 'todo' }) => `Add "${title}" to ${column}`,
    handler({ title, column = 'todo' }) {
      const task = { id: state.nextId, title: title.trim(), column, done: column === 'done' }
      store.set({ tasks: [...state.tasks, task], nextId: state.nextId + 1, dirty: true })
    },
  },
  toggleDone: {
    intent: 'Mark a task done or not done',
    schema: { type: 'object', required: ['id'], additionalProperties: false, properties: { id } },
    available: hasTasks,
    summarize: ({ id }, s) => {
      const t = s.tasks.find((x) => x.id === id)
      return t ? `Mark "${t.title}" ${t.done ? 'not done' : 'done'}` : `Mark task ${id} done or not done`
    },
    handler({ id }) { updateTask(id, { done: !findTask(id).done }) },
  },
  renameTask: {
    intent: 'Rename a task',
    schema: { type: 'object', required: ['id', 'title'], additionalProperties: false, properties: { id, title } },
    available: hasTasks,
    summarize: ({ id, title }, s) => `Rename ${named(s, id)} to "${title}"`,
    handler({ id, title }) { updateTask(id, { title: title.trim() }) },
  },
  moveTask: {
    intent: 'Move a task to another column',
    schema: { type: 'object', required: ['id', 'column'], additionalProperties: false, properties: { id, column } },
    available: hasTasks,
    summarize: ({ id, column }, s) => `Move ${named(s, id)} to ${column}`,
    handler({ id, column }) { updateTask(id, { column, done: column === 'done' ? true : findTask(id).done }) },
  },
  setFilter: {
    intent: 'Show all, only active, or only done tasks',
    schema: { type: 'object', required: ['filter'], additionalProperties: false, properties: { filter: { enum: FILTERS } } },
    alwaysAffordable: true,
    summarize: ({ filter }) => (filter === 'all' ? 'Show all tasks' : `Show only ${filter} tasks`),
    handler({ filter }) { store.set({ filter }) },
  },
  save: {
    intent: 'Save the board to the server (async, about 150 ms)',
    schema: { type: 'object', additionalProperties: false, properties: {} },
    available: (s) => (s.saving ? 'a save is already running' : true),
    emits: [],
    summarize: (_, s) => `Save the board (${plural(s.tasks.length, 'task')})`,
    async handler() {
      store.set({ saving: true, saveError: null })
      try {
        const res = await fetch('/demo/save', {
          method: 'POST', headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ tasks: state.tasks }),
        })
        if (!res.ok) throw new Error(`save failed: HTTP ${res.status}`)
        const body = await res.json()
        store.set({ saving: false, dirty: false, savedAt: body.savedAt })
      } catch (e) {
        store.set({ saving: false, saveError: String(e.message || e) })
        throw e
      }
    },
  },
  clearAll: {
    intent: 'Delete every task',
    requiresConfirm: true,
    warning: 'Deletes all tasks; the user must approve it in the app.',
    schema: { type: 'object', additionalProperties: false, properties: {} },
    available: hasTasks,
    summarize: (_, s) => `Delete every task (${plural(s.tasks.length, 'task')})`,
    handler() { store.set({ tasks: [], dirty: true }) },
  },
  resetDemo: {
    intent: 'Reset the demo board (humans only)',
    humanOnly: true,
    handler() { state = initialBoard(); store.set({}) },
  },
}

// ── the agent ──
const agent = createAgent({
  app: { name: 'taskboard', version: '1.0.0' },
  getState: store.get,
  subscribe: store.subscribe,
  actions,
  docs: {
    purpose: 'A kanban task board with three columns: todo, doing, done.',
    tips: ['Task ids are in /tasks/*/id.', 'Call save after edits; it is asynchronous.'],
  },
  context(s) {
    const count = (c) => s.tasks.filter((t) => t.column === c).length
    const hints = ['Use moveTask to change a column; toggleDone only flips the checkbox.']
    if (s.dirty) hints.push('There are unsaved changes: call save when you are done editing.')
    return {
      summary: `${plural(s.tasks.length, 'task')} (${COLUMNS.map((c) => `${count(c)} ${c}`).join(', ')}); filter ${s.filter}; ${s.dirty ? 'unsaved changes' : 'saved'}.`,
      hints,
      cautions: ['clearAll needs the user to approve it in the app; resetDemo is only for humans.'],
    }
  },
})
window.__lapd = agent

// The page's own buttons run the same handlers (a human click is never gated).
function run(name, payload = {}) {
  try {
    const r = actions[name].handler(payload, { state, dispatch: () => {}, source: 'agent', msg: { type: name, ...payload } })
    if (r && typeof r.catch === 'function') r.catch((e) => console.warn(e))
  } catch (e) { console.warn(e) }
}

// ── rendering ──
const $ = (sel) => document.querySelector(sel)
function h(tag, props = {}, ...children) {
  const el = document.createElement(tag)
  for (const [k, v] of Object.entries(props)) {
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v)
    else if (k === 'class') el.className = v
    else if (k === 'text') el.textContent = v
    else if (v === true) el.setAttribute(k, '')
    else if (v !== false && v != null) el.setAttribute(k, v)
  }
  el.append(...children.filter(Boolean))
  return el
}

let editing = null // id of the task being renamed

function taskItem(t) {
  const box = h('input', { type: 'checkbox', 'aria-label': `Done: ${t.title}`, checked: t.done, onchange: () => run('toggleDone', { id: t.id }) })
  const move = h('select', { 'aria-label': `Column for ${t.title}`, onchange: (e) => run('moveTask', { id: t.id, column: e.target.value }) },
    ...COLUMNS.map((c) => h('option', { value: c, selected: c === t.column, text: c })))
  let label
  if (editing === t.id) {
    label = h('input', { class: 'rename', value: t.title, 'aria-label': 'New title', maxlength: '120' })
    const commit = () => { const v = label.value.trim(); editing = null; if (v && v !== t.title) run('renameTask', { id: t.id, title: v }); else render() }
    label.addEventListener('keydown', (e) => { if (e.key === 'Enter') commit(); if (e.key === 'Escape') { editing = null; render() } })
    label.addEventListener('blur', commit)
    queueMicrotask(() => label.focus())
  } else {
    label = h('span', { class: 'title', tabindex: '0', title: 'Double-click (or Enter) to rename', text: t.title })
    const edit = () => { editing = t.id; render() }
    label.addEventListener('dblclick', edit)
    label.addEventListener('keydown', (e) => { if (e.key === 'Enter') edit() })
  }
  // The label around the checkbox is its tap target (44 px on a phone).
  return h('li', { class: `task${t.done ? ' is-done' : ''}`, 'data-agent': 'task', 'data-task-id': String(t.id) }, h('label', { class: 'check' }, box), label, move)
}

function render() {
  const s = state
  const visible = s.tasks.filter((t) => s.filter === 'all' || (s.filter === 'done' ? t.done : !t.done))
  $('#board').replaceChildren(...COLUMNS.map((c) => {
    const items = visible.filter((t) => t.column === c)
    return h('section', { class: 'column', 'data-column': c, 'aria-label': `${c} column` },
      h('h2', { text: `${c} · ${items.length}` }),
      items.length ? h('ul', {}, ...items.map(taskItem)) : h('p', { class: 'empty', text: 'Nothing here' }))
  }))
  for (const b of document.querySelectorAll('[data-filter]')) b.setAttribute('aria-pressed', String(b.dataset.filter === s.filter))
  $('#save').disabled = s.saving
  $('#save').textContent = s.saving ? 'Saving…' : 'Save'
  $('#clear').disabled = s.tasks.length === 0
  const st = $('#save-status')
  st.className = s.saving ? 'saving' : s.saveError ? 'error' : s.dirty ? 'dirty' : ''
  st.textContent = s.saving ? 'Saving…' : s.saveError ? s.saveError
    : s.dirty ? 'Unsaved changes' : s.savedAt ? `Saved at ${new Date(s.savedAt).toLocaleTimeString()}` : 'No changes yet'
}

$('#add-form').addEventListener('submit', (e) => {
  e.preventDefault()
  const input = $('#new-title')
  const v = input.value.trim()
  if (!v) return
  run('addTask', { title: v })
  input.value = ''
})
for (const b of document.querySelectorAll('[data-filter]')) b.addEventListener('click', () => run('setFilter', { filter: b.dataset.filter }))
$('#save').addEventListener('click', () => run('save'))
$('#clear').addEventListener('click', () => { if (confirm('Delete every task?')) run('clearAll') })
$('#reset').addEventListener('click', () => run('resetDemo'))

store.subscribe(render)
render()
