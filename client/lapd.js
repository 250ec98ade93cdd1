// lapd.js: the browser side of lapd. One ES module, no build step, no dependencies.
//
// Quick start (in your page):
//
//   import { createAgent } from '/agent/client.js'
//   const agent = createAgent({
//     app: { name: 'taskboard', version: '1.0.0' },
//     getState: () => store.state,
//     subscribe: (fn) => store.subscribe(fn),          // optional; else polling
//     actions: {
//       addTask: {
//         intent: 'Add a task',
//         schema: { type: 'object', required: ['title'],
//                   properties: { title: { type: 'string', minLength: 1 } } },
//         handler: ({ title }) => store.addTask(title),  // may return a Promise
//       },
//       clearAll: { intent: 'Delete every task', requiresConfirm: true, handler: () => store.clear(),
//                   summarize: (msg, s) => `Delete every task (${s.tasks.length})` }, // for the panel
//       reset:    { intent: 'Reset the demo', humanOnly: true, handler: () => store.reset() },
//     },
//     context: (state) => ({ summary: `${state.tasks.length} tasks` }),
//   })
//
// The user clicks "Connect an AI" in the small panel (or you call agent.connect()),
// copies the line it shows into their chat, and the LLM can then read the state,
// list the actions and dispatch them. Actions marked requiresConfirm wait for the
// user's Approve in the panel; humanOnly actions are never offered to the LLM.
//
// What this module does, in order of importance:
//   1. Answers the server's rpc frames (get_state, query_state, list_actions,
//      send_message, query_dom, describe_visible_content, describe_context,
//      observe, would_dispatch) from your app's state and actions.
//   2. Keeps the connection alive: mint → WebSocket → hello, heartbeats,
//      reconnect with backoff (1,2,4,8,16,30 s; give up after 5 min), session
//      kept in sessionStorage so a reload resumes without a new token, and a
//      refused token (HTTP 401/403 before the upgrade) stops at once.
//   3. Shows the panel (Shadow DOM; bottom right, a bottom sheet on a phone):
//      connect line, status, pending approvals said in the human's words
//      (actions may give a summarize(msg, state)), an activity feed with
//      relative times. Alt+Shift+A or a skip link takes the keyboard there; a
//      live region tells screen readers. ui:false hides it; every piece is also
//      an event (agent.on('status' | 'confirm' | 'log' | 'active' | 'revoked' | 'error')).
//
// The payload validation done here is a useful subset of JSON Schema (type,
// required, properties, enum, const, minLength, maxLength, pattern, minimum,
// maximum, items, minItems, maxItems, additionalProperties). The lapd server
// enforces the full schema (sent in hello.policy) before a frame reaches the tab.
//
// The pure helpers (computeStateDiff, resolvePointer, backoffDelay, nextState,
// validatePayload, listActions, outline, …) are named exports, so they can be
// tested in Node; importing this module never touches window or document.

export const LAP_VERSION = 2

/** Limits: every size, rate and count the client keeps is bounded. */
export const LIMITS = Object.freeze({
  logEntries: 100, // activity ring
  pendingConfirms: 50,
  outbox: 100, // frames queued while the socket is down
  watches: 32,
  drainErrors: 20,
  validationErrors: 20,
  schemaDepth: 32,
  frameBytes: 4 << 20, // the server closes frames over 4 MiB
  outlineNodes: 200,
  outlineDepth: 8,
  taggedNodes: 1000, // data-agent zones are walked "without caps"; this is the safety net
  textChars: 200,
  queryDomElements: 100,
  reconnectGiveUpMs: 5 * 60 * 1000,
  missedPongs: 2,
  pongTimeoutMs: 5000, // a ping sent with nothing queued ahead of it gets its pong within this, or the socket is dead
  statsSamples: 1000, // rpc timings kept for stats().rpcHandleMsP50
  feedItems: 40, // log entries the panel's feed shows (newest)
  summaryChars: 200, // an action's summarize() text is cut to this
  idempotencyKeys: 200, // send_message keys remembered (sessionStorage), each for its ttl
  idempotencyStoredResult: 16 << 10, // a result is kept across a reload only when its JSON is this small
  idempotencyKeptResult: 256 << 10, // …and in memory only when this small
})

const STORAGE_KEY = 'lapd:session'
const OUTBOX_KEY = 'lapd:outbox'
const IDEM_KEY = 'lapd:idem'
const ANSWERED_KEY = 'lapd:answered'

// ───────────────────────────── JSON Pointer ─────────────────────────────

/** Escape one RFC 6901 segment (~ → ~0, / → ~1). */
export function escapePointerSegment(s) {
  return String(s).replace(/~/g, '~0').replace(/\//g, '~1')
}

function unescapeSegment(s) {
  return s.replace(/~1/g, '/').replace(/~0/g, '~')
}

function own(obj, key) {
  return obj !== null && typeof obj === 'object' && Object.prototype.hasOwnProperty.call(obj, key)
}

/**
 * Resolve a JSON Pointer against a value.
 *
 * Lenient (default, get_state): "" and "/" mean the root, empty segments are
 * skipped, a missing key gives undefined.
 * Strict (query_state): RFC 6901 exactly; returns {found:true, value} or
 * {found:false, detail}.
 */
export function resolvePointer(root, path, { strict = false } = {}) {
  if (!strict) {
    if (path == null || path === '' || path === '/') return root
    let cur = root
    for (const raw of String(path).split('/')) {
      if (raw === '') continue
      const seg = unescapeSegment(raw)
      if (cur === null || typeof cur !== 'object') return undefined
      if (Array.isArray(cur)) {
        if (!/^(0|[1-9]\d*)$/.test(seg)) return undefined
        cur = cur[Number(seg)]
      } else {
        cur = own(cur, seg) ? cur[seg] : undefined
      }
    }
    return cur
  }
  if (typeof path !== 'string') return { found: false, detail: 'path must be a string' }
  if (path === '') return { found: true, value: root }
  if (path[0] !== '/') return { found: false, detail: `invalid pointer "${path}": must be "" or start with "/"` }
  let cur = root
  let at = ''
  for (const raw of path.slice(1).split('/')) {
    if (/~[^01]|~$/.test(raw)) return { found: false, detail: `invalid escape in segment "${raw}"` }
    const seg = unescapeSegment(raw)
    at += '/' + raw
    if (Array.isArray(cur)) {
      if (!/^(0|[1-9]\d*)$/.test(seg)) return { found: false, detail: `${at}: "${seg}" is not an array index` }
      const i = Number(seg)
      if (i >= cur.length) return { found: false, detail: `${at}: index ${i} out of range (length ${cur.length})` }
      cur = cur[i]
    } else if (cur !== null && typeof cur === 'object') {
      if (!own(cur, seg)) return { found: false, detail: `${at}: no such key` }
      cur = cur[seg]
    } else {
      return { found: false, detail: `${at}: cannot index into ${cur === null ? 'null' : typeof cur}` }
    }
  }
  return { found: true, value: cur }
}

// ───────────────────────────── wire encoding ─────────────────────────────

/**
 * The wire form of a value: what JSON carries. Dates become
 * {"__codec":"iso-date","wire":"…"} (as the reference does); undefined and
 * functions vanish.
 */
export function toWire(value) {
  if (value === undefined) return undefined
  const s = JSON.stringify(value, function (key, v) {
    const raw = this[key]
    if (raw instanceof Date) return { __codec: 'iso-date', wire: v }
    return v
  })
  return s === undefined ? undefined : JSON.parse(s)
}

/** Decode tagged values in an incoming msg (the inverse of toWire). */
export function fromWire(value, depth = 0) {
  if (depth > LIMITS.schemaDepth || value === null || typeof value !== 'object') return value
  if (Array.isArray(value)) return value.map((v) => fromWire(v, depth + 1))
  if (value.__codec === 'iso-date' && typeof value.wire === 'string') return new Date(value.wire)
  if (value.__codec === 'epoch-millis' && typeof value.wire === 'number') return new Date(value.wire)
  const out = {}
  for (const k of Object.keys(value)) {
    if (k === '__proto__' || k === 'constructor' || k === 'prototype') continue
    out[k] = fromWire(value[k], depth + 1)
  }
  return out
}

// ───────────────────────────── state diff ─────────────────────────────

function kindOf(v) {
  if (Array.isArray(v)) return 'array'
  if (v !== null && typeof v === 'object') return 'object'
  return 'primitive'
}

/**
 * The JSON-Patch subset (add/remove/replace) that turns `before` into `after`,
 * with the reference's ordering: objects remove keys first, then add and recurse
 * in key order; arrays recurse the shared prefix, remove extra indices from the
 * end, then add new ones. A change of kind is one replace. Root path is "".
 */
export function computeStateDiff(before, after, path = '', out = []) {
  if (Object.is(before, after)) return out
  const kb = kindOf(before)
  const ka = kindOf(after)
  if (kb !== ka || kb === 'primitive') {
    if (before === undefined) out.push({ op: 'add', path, value: after })
    else if (after === undefined) out.push({ op: 'remove', path })
    else out.push({ op: 'replace', path, value: after })
    return out
  }
  if (ka === 'array') {
    const shared = Math.min(before.length, after.length)
    for (let i = 0; i < shared; i++) computeStateDiff(before[i], after[i], `${path}/${i}`, out)
    for (let i = before.length - 1; i >= after.length; i--) out.push({ op: 'remove', path: `${path}/${i}` })
    for (let i = before.length; i < after.length; i++) out.push({ op: 'add', path: `${path}/${i}`, value: after[i] })
    return out
  }
  const bk = Object.keys(before).sort()
  const ak = Object.keys(after).sort()
  for (const k of bk) {
    if (!own(after, k) || after[k] === undefined) {
      if (before[k] !== undefined) out.push({ op: 'remove', path: `${path}/${escapePointerSegment(k)}` })
    }
  }
  for (const k of ak) {
    const p = `${path}/${escapePointerSegment(k)}`
    if (after[k] === undefined) continue
    if (!own(before, k) || before[k] === undefined) out.push({ op: 'add', path: p, value: after[k] })
    else computeStateDiff(before[k], after[k], p, out)
  }
  return out
}

/** "3 changes: /todos/2 added, /filter changed…" */
export function summarizeDiff(diff) {
  if (!Array.isArray(diff) || diff.length === 0) return 'no state change'
  const words = { add: 'added', remove: 'removed', replace: 'changed' }
  const parts = diff.slice(0, 2).map((d) => `${d.path || '(root)'} ${words[d.op] || d.op}`)
  return `${diff.length} change${diff.length === 1 ? '' : 's'}: ${parts.join(', ')}${diff.length > 2 ? '…' : ''}`
}

// ───────────────────────────── connection state machine ─────────────────────────────

export const STATUSES = Object.freeze(['idle', 'minting', 'pending-claude', 'active', 'reconnecting', 'failed', 'error'])

/** Reconnect delay for the n-th attempt (0-based): 1, 2, 4, 8, 16, 30, 30… s. */
export function backoffDelay(attempt) {
  const n = Math.max(0, Math.floor(attempt))
  return Math.min(1000 * Math.min(2 ** Math.min(n, 16), 30), 30000)
}

/** The initial connection state. */
export function initialConnState() {
  return { status: 'idle', attempt: 0, elapsedMs: 0, error: null, message: null }
}

/**
 * The connection transition function (pure). Given a state and an event it
 * returns the next state and the effects the runtime must perform.
 *
 * Events: mint, mint-ok, mint-failed{code,detail}, restore, resume-ok,
 * ws-opened, activated, ws-closed{hasToken}, reconnect-attempt{elapsedMs},
 * refused{code,detail}, revoked, close-final{code,detail}, disconnect, revoke-failed.
 * Effects: {type:'mint'|'open'|'persist'|'clear'|'close'|'revoke'|'schedule', delayMs?}.
 */
export function nextState(s, ev) {
  const st = { ...s, effects: [] }
  const to = (status, effects = [], extra = {}) => ({ ...st, status, effects, ...extra })
  switch (ev.type) {
    case 'mint':
      if (s.status === 'idle' || s.status === 'error' || s.status === 'failed')
        return to('minting', [{ type: 'mint' }], { error: null, message: null, attempt: 0, elapsedMs: 0 })
      return st
    case 'mint-ok':
      if (s.status !== 'minting') return st
      return to('pending-claude', [{ type: 'persist' }, { type: 'open' }])
    case 'mint-failed':
      if (s.status !== 'minting') return st
      return to('error', [], { error: { code: ev.code || 'network', detail: ev.detail || '' } })
    case 'restore':
      if (s.status !== 'idle' && s.status !== 'failed' && s.status !== 'error') return st
      return to('pending-claude', [{ type: 'open' }], { error: null, message: null, attempt: 0, elapsedMs: 0 })
    case 'resume-ok':
      return to('pending-claude', [{ type: 'close' }, { type: 'persist' }, { type: 'open' }], {
        error: null, message: null, attempt: 0, elapsedMs: 0,
      })
    case 'ws-opened':
      if (s.status === 'reconnecting') return to('pending-claude', [], { attempt: 0, elapsedMs: 0 })
      return st
    case 'activated':
      if (s.status === 'pending-claude' || s.status === 'reconnecting' || s.status === 'active')
        return to('active', [], { attempt: 0, elapsedMs: 0 })
      return st
    case 'ws-closed':
      if (!ev.hasToken) return to('idle')
      if (s.status === 'idle' || s.status === 'failed' || s.status === 'error' || s.status === 'minting') return st
      return to('reconnecting', [{ type: 'schedule', delayMs: backoffDelay(s.status === 'reconnecting' ? s.attempt : 0) }], {
        attempt: s.status === 'reconnecting' ? s.attempt : 0,
        elapsedMs: s.status === 'reconnecting' ? s.elapsedMs : 0,
      })
    case 'reconnect-attempt': {
      if (s.status !== 'reconnecting') return st
      const elapsedMs = s.elapsedMs + (ev.elapsedMs || 0)
      if (elapsedMs >= LIMITS.reconnectGiveUpMs)
        return to('failed', [{ type: 'close' }], { elapsedMs, message: 'Gave up reconnecting after 5 minutes' })
      return to('reconnecting', [{ type: 'open' }], { attempt: s.attempt + 1, elapsedMs })
    }
    case 'refused':
      return to('error', [{ type: 'clear' }, { type: 'close' }], {
        error: { code: ev.code || 'auth-failed', detail: ev.detail || '' },
      })
    case 'revoked':
      return to('idle', [{ type: 'clear' }, { type: 'close' }], { message: 'The session was revoked', error: null })
    case 'close-final':
      return to('error', [{ type: 'close' }], { error: { code: ev.code || 'closed', detail: ev.detail || '' } })
    case 'disconnect':
      return to('idle', [{ type: 'revoke' }, { type: 'clear' }, { type: 'close' }], { error: null, message: null, attempt: 0, elapsedMs: 0 })
    case 'revoke-failed': // the Disconnect's revoke did not reach lapd: say so, the human thinks it is over
      if (s.status !== 'idle') return st
      return to('idle', [], { message: REVOKE_FAILED })
    default:
      return st
  }
}

const REVOKE_FAILED = 'Disconnected here, but lapd could not be reached to end the AI\'s session at once. ' +
  'With this tab gone, the session expires by itself at the end of lapd\'s grace window (a minute by default).'

/** The line the user pastes into their chat. */
export function connectLine(lapUrl, token) {
  return `Connect to my app with lapd: connect_session url=${lapUrl} token=${token}`
}

// ───────────────────────────── payload validation ─────────────────────────────

function typeMatches(t, v) {
  switch (t) {
    case 'string': return typeof v === 'string'
    case 'number': return typeof v === 'number' && Number.isFinite(v)
    case 'integer': return typeof v === 'number' && Number.isInteger(v)
    case 'boolean': return typeof v === 'boolean'
    case 'null': return v === null
    case 'array': return Array.isArray(v)
    case 'object': return v !== null && typeof v === 'object' && !Array.isArray(v)
    default: return true
  }
}

function jsonEqual(a, b) {
  return JSON.stringify(a) === JSON.stringify(b)
}

/**
 * Validate a value against the JSON Schema subset this client knows. Returns
 * [{path, code, message}] with JSON Pointer paths (at most
 * LIMITS.validationErrors) and the reference's codes (missing,
 * unexpected-field, wrong-type, not-array, not-object, not-in-enum,
 * validates-failed). Unknown keywords are ignored (the server checks the full
 * schema).
 */
export function validatePayload(schema, value, path = '', errors = [], depth = 0) {
  if (errors.length >= LIMITS.validationErrors || schema == null || schema === true) return errors
  const add = (message, code = 'validates-failed') => { if (errors.length < LIMITS.validationErrors) errors.push({ path, code, message }) }
  if (schema === false) { add('no value is allowed here'); return errors }
  if (typeof schema !== 'object' || depth > LIMITS.schemaDepth) return errors
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type]
    if (!types.some((t) => typeMatches(t, value))) {
      add(`expected ${types.join(' or ')}, got ${value === null ? 'null' : Array.isArray(value) ? 'array' : typeof value}`,
        types.length === 1 && types[0] === 'array' ? 'not-array' : types.length === 1 && types[0] === 'object' ? 'not-object' : 'wrong-type')
      return errors
    }
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => jsonEqual(e, value)))
    add(`must be one of ${schema.enum.map((e) => JSON.stringify(e)).join(', ')}`, 'not-in-enum')
  if ('const' in schema && !jsonEqual(schema.const, value)) add(`must be ${JSON.stringify(schema.const)}`, 'not-in-enum')
  if (typeof value === 'string') {
    const len = [...value].length
    if (typeof schema.minLength === 'number' && len < schema.minLength) add(`must be at least ${schema.minLength} characters`)
    if (typeof schema.maxLength === 'number' && len > schema.maxLength) add(`must be at most ${schema.maxLength} characters`)
    if (typeof schema.pattern === 'string') {
      try { if (!new RegExp(schema.pattern, 'u').test(value)) add(`must match ${schema.pattern}`) } catch { /* server checks */ }
    }
  }
  if (typeof value === 'number') {
    if (typeof schema.minimum === 'number' && value < schema.minimum) add(`must be >= ${schema.minimum}`)
    if (typeof schema.maximum === 'number' && value > schema.maximum) add(`must be <= ${schema.maximum}`)
    if (typeof schema.exclusiveMinimum === 'number' && value <= schema.exclusiveMinimum) add(`must be > ${schema.exclusiveMinimum}`)
    if (typeof schema.exclusiveMaximum === 'number' && value >= schema.exclusiveMaximum) add(`must be < ${schema.exclusiveMaximum}`)
  }
  if (Array.isArray(value)) {
    if (typeof schema.minItems === 'number' && value.length < schema.minItems) add(`must have at least ${schema.minItems} items`)
    if (typeof schema.maxItems === 'number' && value.length > schema.maxItems) add(`must have at most ${schema.maxItems} items`)
    if (schema.items && typeof schema.items === 'object')
      value.forEach((v, i) => validatePayload(schema.items, v, `${path}/${i}`, errors, depth + 1))
  }
  if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
    const props = schema.properties && typeof schema.properties === 'object' ? schema.properties : {}
    if (Array.isArray(schema.required)) {
      for (const k of schema.required) {
        if (!own(value, k) || value[k] === undefined) {
          if (errors.length < LIMITS.validationErrors)
            errors.push({ path: `${path}/${escapePointerSegment(k)}`, code: 'missing', message: 'is required' })
        }
      }
    }
    for (const k of Object.keys(value)) {
      const p = `${path}/${escapePointerSegment(k)}`
      if (own(props, k)) validatePayload(props[k], value[k], p, errors, depth + 1)
      else if (schema.additionalProperties === false) {
        if (errors.length < LIMITS.validationErrors) errors.push({ path: p, code: 'unexpected-field', message: 'is not allowed' })
      } else if (schema.additionalProperties && typeof schema.additionalProperties === 'object')
        validatePayload(schema.additionalProperties, value[k], p, errors, depth + 1)
    }
  }
  return errors
}

/**
 * A JSON Pointer into msg written the reference runtime's way: keys joined
 * with dots, array indices in brackets ("/cells/0/value" → "cells[0].value");
 * a key with a dot, a bracket or a quote is written ["key"].
 */
export function referencePath(pointer, msg) {
  if (typeof pointer !== 'string' || pointer[0] !== '/') return pointer === undefined ? '' : String(pointer)
  let cur = msg
  let out = ''
  for (const raw of pointer.slice(1).split('/')) {
    const seg = unescapeSegment(raw)
    if (Array.isArray(cur)) {
      out += `[${seg}]`
      cur = /^(0|[1-9]\d*)$/.test(seg) ? cur[Number(seg)] : undefined
      continue
    }
    cur = own(cur, seg) ? cur[seg] : undefined
    if (seg === '' || /[.[\]"]/.test(seg)) out += `[${JSON.stringify(seg)}]`
    else out += (out ? '.' : '') + seg
  }
  return out
}

// ───────────────────────────── actions: policy, list, hints ─────────────────────────────

function payloadOf(msg) {
  const { type, ...payload } = msg
  return payload
}

function skeleton(schema, depth = 0) {
  if (!schema || typeof schema !== 'object' || depth > 6) return undefined
  if ('default' in schema && schema.default !== null) return schema.default
  if (Array.isArray(schema.examples) && schema.examples.length && schema.examples[0] !== null) return schema.examples[0]
  if ('const' in schema && schema.const !== null) return schema.const
  if (Array.isArray(schema.enum)) return schema.enum.find((e) => e !== null)
  const t = Array.isArray(schema.type) ? schema.type.find((x) => x !== 'null') : schema.type
  switch (t) {
    case 'string': return schema.minLength > 0 ? '…' : ''
    case 'number': case 'integer': return typeof schema.minimum === 'number' ? schema.minimum : 0
    case 'boolean': return false
    case 'array': return []
    case 'object': case undefined: {
      if (!schema.properties) return t === 'object' ? {} : undefined
      const o = {}
      for (const k of Array.isArray(schema.required) ? schema.required : []) {
        const v = skeleton(schema.properties[k], depth + 1)
        if (v !== undefined) o[k] = v
      }
      return o
    }
    default: return undefined
  }
}

/** A msg skeleton {type, …required fields} with no null placeholders; null when the action has no schema. */
export function payloadHint(variant, schema) {
  if (!schema || typeof schema !== 'object') return null
  const body = skeleton({ ...schema, type: 'object' })
  return { type: variant, ...(body && typeof body === 'object' ? body : {}) }
}

/** [{path, hint}] from the schema's property descriptions (nested objects use dotted paths). */
export function fieldHints(schema, prefix = '', out = [], depth = 0) {
  if (!schema || typeof schema !== 'object' || !schema.properties || depth > 6) return out
  for (const [k, sub] of Object.entries(schema.properties)) {
    if (!sub || typeof sub !== 'object') continue
    const p = prefix ? `${prefix}.${k}` : k
    if (typeof sub.description === 'string' && sub.description) out.push({ path: p, hint: sub.description })
    fieldHints(sub, p, out, depth + 1)
  }
  return out
}

/**
 * The list_actions result for a state. humanOnly actions are never listed;
 * available(state) returning a string marks the action unavailable with that
 * reason. `visible(name)` (optional) says whether a data-agent binding for the
 * action is on screen, giving source 'binding'.
 */
export function listActions(actions, state, { affordances = null, visible = null } = {}) {
  if (!actions || typeof actions !== 'object') return []
  const afford = Array.isArray(affordances) ? new Set(affordances.map((a) => (typeof a === 'string' ? a : a && a.type))) : null
  const out = []
  for (const [variant, a] of Object.entries(actions)) {
    if (!a || a.humanOnly) continue
    const source = a.alwaysAffordable ? 'always-affordable'
      : (afford && afford.has(variant)) || (visible && visible(variant)) ? 'binding' : 'schema'
    const item = {
      variant,
      intent: a.intent ?? null,
      requiresConfirm: !!a.requiresConfirm,
      dispatchMode: a.agentOnly ? 'agent-only' : 'shared',
      source,
      selectorHint: null,
      payloadHint: payloadHint(variant, a.schema),
      warning: a.warning ?? null,
      examples: Array.isArray(a.examples) ? a.examples : [],
      emits: Array.isArray(a.emits) ? a.emits : [],
      fieldHints: fieldHints(a.schema),
    }
    if (typeof a.available === 'function') {
      let r
      try { r = a.available(state) } catch (e) { r = `availability check threw: ${errMessage(e)}` }
      if (r !== true && r !== undefined) {
        item.available = false
        item.unavailableReason = typeof r === 'string' ? r : 'not available right now'
      }
    }
    out.push(item)
  }
  return out
}

/** hello.policy (docs/PROTOCOL.md): JSON Schema per variant plus annotations. */
export function buildPolicy(actions) {
  if (!actions || typeof actions !== 'object') return null
  const variants = {}
  for (const [name, a] of Object.entries(actions)) {
    if (!a) continue
    const v = {}
    if (a.intent) v.intent = a.intent
    if (a.schema && typeof a.schema === 'object') v.schema = a.schema
    for (const k of ['requiresConfirm', 'humanOnly', 'agentOnly', 'alwaysAffordable']) if (a[k]) v[k] = true
    if (Array.isArray(a.examples) && a.examples.length) v.examples = a.examples
    if (typeof a.warning === 'string' && a.warning) v.warning = a.warning
    if (Array.isArray(a.emits) && a.emits.length) v.emits = a.emits
    variants[name] = v
  }
  return { variants }
}

function compilerField(s, depth = 0) {
  if (!s || typeof s !== 'object' || depth > 6) return 'unknown'
  if (Array.isArray(s.enum)) return { enum: s.enum }
  const t = Array.isArray(s.type) ? s.type.find((x) => x !== 'null') : s.type
  if (t === 'string' || t === 'boolean') return t
  if (t === 'number' || t === 'integer') return 'number'
  if (t === 'array') return { kind: 'array', element: compilerField(s.items, depth + 1) }
  if (t === 'object' || s.properties) return { kind: 'object', shape: compilerShape(s, depth + 1) }
  return 'unknown'
}

function compilerShape(schema, depth = 0) {
  const shape = {}
  const req = new Set(Array.isArray(schema && schema.required) ? schema.required : [])
  for (const [k, sub] of Object.entries((schema && schema.properties) || {})) {
    const f = compilerField(sub, depth)
    const hint = sub && typeof sub.description === 'string' ? sub.description : undefined
    shape[k] = req.has(k) && !hint ? f : { type: f, ...(req.has(k) ? {} : { optional: true }), ...(hint ? { hint } : {}) }
  }
  return shape
}

/** hello.msgSchema in the reference's compiler shape {discriminant, variants} (humanOnly variants included, as there). */
export function buildMsgSchema(actions) {
  const variants = {}
  for (const [name, a] of Object.entries(actions || {})) if (a) variants[name] = compilerShape(a.schema)
  return { discriminant: 'type', variants }
}

function fnv1a(s) {
  let h = 0x811c9dc5
  for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0 }
  return h.toString(16).padStart(8, '0')
}

/**
 * The dispatch gate shared by send_message and would_dispatch: null when the
 * msg may go on, else {status:'rejected', reason, detail, errors?}.
 */
export function gateMessage(actions, msg) {
  if (!msg || typeof msg !== 'object' || typeof msg.type !== 'string' || !msg.type)
    return { status: 'rejected', reason: 'invalid', detail: 'msg.type must be a non-empty string' }
  if (!actions) return null
  const a = own(actions, msg.type) ? actions[msg.type] : null
  if (!a) return { status: 'rejected', reason: 'invalid', detail: `unknown variant: ${msg.type}` }
  if (a.humanOnly)
    return { status: 'rejected', reason: 'human-only', detail: `"${msg.type}" can only be done by the user in the app; ask them to do it` }
  if (a.schema) {
    const errors = validatePayload(a.schema, payloadOf(msg))
    if (errors.length)
      return { status: 'rejected', reason: 'invalid', detail: errors.map((e) => `${e.path || '(payload)'}: ${e.message}`).join('; '), errors }
  }
  return null
}

/** Reference log detail for a send: first 3 non-type fields as k=v. */
export function msgDetail(msg) {
  const cut = (s) => (s.length > 30 ? s.slice(0, 30) + '…' : s)
  return Object.keys(msg || {}).filter((k) => k !== 'type').slice(0, 3).map((k) => {
    const v = msg[k]
    let s
    if (typeof v === 'string') s = JSON.stringify(v)
    else if (Array.isArray(v)) s = `[${v.length}]`
    else if (v && typeof v === 'object') s = `{${Object.keys(v).slice(0, 3).join(',')}}`
    else s = String(v)
    return `${k}=${cut(s)}`
  }).join(' ')
}

// ───────────────────────────── the human's words (panel feed and approvals) ─────────────────────────────

function clip(s, n) { return s.length > n ? s.slice(0, n - 1) + '…' : s }

/**
 * A msg in the human's words: the action's summarize(msg, state) when it has
 * one (e.g. `Delete every task (6 tasks)`), else its intent followed by the
 * payload's first few plain values (`Add a task: "Buy milk"`). Never throws.
 */
export function describeMsg(actions, msg, state, fallbackIntent) {
  if (!msg || typeof msg !== 'object') return String(fallbackIntent || 'an action')
  const a = actions && typeof msg.type === 'string' && own(actions, msg.type) ? actions[msg.type] : null
  if (a && typeof a.summarize === 'function') {
    try {
      const s = a.summarize(msg, state)
      if (typeof s === 'string' && s.trim()) return clip(s.trim(), LIMITS.summaryChars)
    } catch { /* fall back to the intent */ }
  }
  const intent = (a && a.intent) || fallbackIntent || String(msg.type || 'an action')
  const vals = []
  for (const [k, v] of Object.entries(msg)) {
    if (k === 'type' || vals.length >= 3) continue
    if (typeof v === 'string' && v) vals.push(JSON.stringify(clip(v, 60)))
    else if (typeof v === 'number' || typeof v === 'boolean') vals.push(`${k} ${v}`)
  }
  return clip(vals.length ? `${intent}: ${vals.join(', ')}` : intent, LIMITS.summaryChars)
}

/** "just now", "40 s ago", "3 min ago", "2 h ago", else the date. */
export function relativeTime(at, now = Date.now()) {
  if (typeof at !== 'number' || !Number.isFinite(at)) return ''
  const s = Math.max(0, Math.round((now - at) / 1000))
  if (s < 10) return 'just now'
  if (s < 60) return `${s} s ago`
  const m = Math.floor(s / 60)
  if (m < 60) return `${m} min ago`
  const h = Math.floor(m / 60)
  if (h < 24) return `${h} h ago`
  return new Date(at).toISOString().slice(0, 10)
}

// What a read looked like to the human.
const READ_WORDS = {
  'Observe the app': 'Looked at the app', 'Read app state': "Read the app's data", 'List actions': 'Checked what it can do',
  'Describe visible content': 'Looked at the screen', 'Describe context': 'Read the app\'s notes', 'Query app state': "Read part of the app's data",
}

const BLOCK_WORDS = {
  'human-only': 'only you can do this, in the app',
  invalid: 'not something the app allows',
  'schema-error': 'the details were not valid',
  'schema-mismatch': 'the details were not valid',
}

/**
 * The feed's items, newest first, from log entries (oldest first): an
 * approval's outcome is folded into the entry that proposed it (one line,
 * updated in place), consecutive reads become one line with a count. Each
 * item is {id, at, tone, label, text, detail?}: label and text in the human's
 * words, detail the technical part (JSON paths, codes) for an expandable view.
 * notes maps an entry id to {summary} (see describeMsg).
 */
export function feedItems(entries, notes = new Map()) {
  const outcomes = new Map() // confirmId → the entry that resolved it
  for (const e of entries) if (e && e.confirmId && (e.kind === 'confirmed' || e.kind === 'rejected')) outcomes.set(e.confirmId, e)
  const proposed = new Set(entries.filter((e) => e && e.kind === 'proposed' && e.confirmId).map((e) => e.confirmId))
  const out = []
  for (const e of entries) {
    if (!e || typeof e !== 'object') continue
    if ((e.kind === 'confirmed' || e.kind === 'rejected') && e.confirmId && proposed.has(e.confirmId)) continue
    const note = notes.get(e.id)
    const what = (note && note.summary) || e.intent || e.variant || e.kind || 'something'
    const item = { id: String(e.id ?? ''), at: e.at, tone: 'info', label: '', text: what, detail: '' }
    switch (e.kind) {
      case 'narrate':
        Object.assign(item, { tone: 'narrate', label: 'AI', text: String(e.detail || e.intent || '') })
        break
      case 'dispatched':
        Object.assign(item, { tone: 'ok', label: 'Done', detail: diffLines(e.stateDiff) })
        break
      case 'proposed':
      case 'confirmed':
      case 'rejected': {
        const end = e.kind === 'proposed' ? outcomes.get(e.confirmId) : e
        // Answered, the line says what was done then (the state may have
        // changed since the AI asked: "Delete every task (5 tasks)", not 4).
        const then = end && end !== e && notes.get(end.id)
        if (then && then.summary) item.text = then.summary
        if (!end) Object.assign(item, { tone: 'wait', label: 'Waiting for your approval' })
        else if (end.kind === 'confirmed') Object.assign(item, { tone: 'ok', label: 'Approved by you', at: end.at, detail: /^errors/.test(end.detail || '') ? end.detail : '' })
        else if (/^expired/.test(end.detail || '')) Object.assign(item, { tone: 'bad', label: 'Expired, not done', at: end.at })
        else Object.assign(item, { tone: 'bad', label: 'Rejected by you', at: end.at })
        break
      }
      case 'blocked': {
        const reason = String(e.detail || '').split(':')[0]
        Object.assign(item, { tone: 'bad', label: 'Blocked', text: `${what}: ${BLOCK_WORDS[reason] || 'refused'}`, detail: String(e.detail || '') })
        break
      }
      case 'error':
        Object.assign(item, { tone: 'bad', label: 'Failed', detail: String(e.detail || '') })
        break
      default: { // read
        const words = READ_WORDS[e.intent] || (/^Query DOM/.test(e.intent || '') ? 'Looked at part of the page'
          : /^Predict/.test(e.intent || '') ? 'Tried an action out without doing it' : 'Read the app')
        const prev = out[out.length - 1]
        if (prev && prev.tone === 'read' && prev.text === words) { prev.count = (prev.count || 1) + 1; prev.at = e.at; continue }
        Object.assign(item, { tone: 'read', label: '', text: words, detail: e.intent && e.intent !== words ? String(e.intent) : '' })
      }
    }
    out.push(item)
  }
  return out.reverse()
}

function diffLines(diff) {
  if (!Array.isArray(diff) || !diff.length) return 'no change to the app\'s data'
  const words = { add: 'added', remove: 'removed', replace: 'changed' }
  const lines = diff.slice(0, 8).map((d) => `${d.path || '(everything)'} ${words[d.op] || d.op}`)
  if (diff.length > 8) lines.push(`… and ${diff.length - 8} more`)
  return lines.join('\n')
}

// ───────────────────────────── DOM reading (works on any DOM-like object) ─────────────────────────────

function tagOf(el) { return String(el.tagName || '').toLowerCase() }
function attr(el, name) { return typeof el.getAttribute === 'function' ? el.getAttribute(name) : null }
function kids(el) { return Array.from(el.children || []) }
// Visible-ish text: skips script/style/template and the option labels of selects.
function rawText(el, depth = 0) {
  if (!el.childNodes || depth > 32) return String(el.textContent || '')
  let out = ''
  for (const n of Array.from(el.childNodes)) {
    if (n.nodeType === 3) out += n.nodeValue
    else if (n.nodeType === 1 && !TEXT_SKIP.has(tagOf(n))) out += ' ' + rawText(n, depth + 1)
  }
  return out
}
const TEXT_SKIP = new Set(['script', 'style', 'noscript', 'template', 'select'])
function textOf(el) {
  const t = rawText(el).replace(/\s+/g, ' ').trim()
  return t.length > LIMITS.textChars ? t.slice(0, LIMITS.textChars) + '…' : t
}
// lapd's own panel and skip link are not part of the app the AI reads.
function isLapdUI(el) { return attr(el, 'data-lapd-panel') !== null || attr(el, 'data-lapd-skip') !== null }
function isHidden(el) {
  if (el.hidden === true || attr(el, 'hidden') !== null || attr(el, 'aria-hidden') === 'true') return true
  if (isLapdUI(el)) return true
  const style = el.style
  return !!(style && (style.display === 'none' || style.visibility === 'hidden'))
}
const SKIP = new Set(['script', 'style', 'noscript', 'template'])

function mapNode(el, depth, budget, maxDepth, out) {
  if (budget.left <= 0) { budget.truncated = true; return }
  const tag = tagOf(el)
  if (SKIP.has(tag) || isHidden(el)) return
  if (tag === 'input' && String(attr(el, 'type') || '').toLowerCase() === 'hidden') return
  const push = (n) => { budget.left--; out.push(n) }
  if (/^h[1-6]$/.test(tag)) { const text = textOf(el); if (text) push({ kind: 'heading', level: Number(tag[1]), text }); return }
  if (tag === 'button') {
    const text = textOf(el) || attr(el, 'aria-label') || ''
    if (text) push({ kind: 'button', text, disabled: !!el.disabled || attr(el, 'disabled') !== null, actionVariant: attr(el, 'data-agent') })
    return
  }
  if (tag === 'a' && attr(el, 'href') !== null) { push({ kind: 'link', text: textOf(el), href: attr(el, 'href') }); return }
  if (tag === 'input' || tag === 'textarea' || tag === 'select') {
    push({ kind: 'input', label: attr(el, 'aria-label') ?? attr(el, 'name'), value: el.value ?? attr(el, 'value') ?? '', type: tag === 'input' ? (attr(el, 'type') || 'text') : tag })
    return
  }
  if (tag === 'ul' || tag === 'ol') {
    const items = []
    for (const li of kids(el)) {
      if (budget.left - items.length <= 1) { budget.truncated = true; break }
      if (isHidden(li)) continue
      const text = textOf(li)
      if (text) items.push({ kind: 'item', text })
    }
    if (items.length) { budget.left -= items.length; push({ kind: 'list', items }) }
    return
  }
  const children = kids(el)
  if (children.length === 0) { const text = textOf(el); if (text) push({ kind: 'text', text }); return }
  if (depth >= maxDepth) { budget.truncated = true; return }
  for (const c of children) mapNode(c, depth + 1, budget, maxDepth, out)
}

function taggedZones(el, out, depth = 0) {
  if (depth > 64 || out.length >= LIMITS.taggedNodes) return out
  for (const c of kids(el)) {
    if (isLapdUI(c)) continue
    if (attr(c, 'data-agent') !== null) out.push(c)
    else taggedZones(c, out, depth + 1)
  }
  return out
}

/**
 * describe_visible_content's outline of a DOM subtree: the top-level
 * [data-agent] zones when there are any (each as {kind:'region', name,
 * children}), else a fallback walk capped at 200 nodes and depth 8.
 * Returns {outline, source:'data-agent'|'fallback'|'truncated'}.
 */
export function outline(root, { maxNodes = LIMITS.outlineNodes, maxDepth = LIMITS.outlineDepth } = {}) {
  if (!root) return { outline: [], source: 'fallback' }
  const zones = taggedZones(root, [])
  if (zones.length) {
    const budget = { left: LIMITS.taggedNodes, truncated: false }
    const out = []
    for (const z of zones) {
      if (isHidden(z)) continue
      const tag = tagOf(z)
      if (tag === 'button' || tag === 'a' || tag === 'input' || /^h[1-6]$/.test(tag)) { mapNode(z, 0, budget, 64, out); continue }
      const children = []
      for (const c of kids(z)) mapNode(c, 1, budget, 64, children)
      if (!kids(z).length) { const text = textOf(z); if (text) children.push({ kind: 'text', text }) }
      budget.left--
      out.push({ kind: 'region', name: attr(z, 'data-agent'), children })
    }
    return { outline: out, source: budget.truncated ? 'truncated' : 'data-agent' }
  }
  const budget = { left: maxNodes, truncated: false }
  const out = []
  for (const c of kids(root)) mapNode(c, 1, budget, maxDepth, out)
  return { outline: out, source: budget.truncated ? 'truncated' : 'fallback' }
}

/** query_dom: [data-agent="name"] elements under root as {text, attrs, path}. */
export function queryDom(root, name, multiple = false) {
  const found = []
  const walk = (el, path) => {
    kids(el).forEach((c, i) => {
      if (found.length >= (multiple ? LIMITS.queryDomElements : 1)) return
      if (isLapdUI(c)) return
      const p = [...path, i]
      if (attr(c, 'data-agent') === name) {
        const attrs = {}
        for (const a of Array.from(c.attributes || [])) attrs[a.name] = a.value
        found.push({ text: String(c.textContent || '').trim().slice(0, 2000), attrs, path: p })
      }
      if (p.length < 64) walk(c, p)
    })
  }
  if (root) walk(root, [])
  return found
}

// ───────────────────────────── runtime ─────────────────────────────

function errMessage(e) {
  if (e && typeof e === 'object' && 'message' in e) return String(e.message)
  return String(e)
}

function uuid() {
  const c = globalThis.crypto
  if (c && typeof c.randomUUID === 'function') return c.randomUUID()
  return 'id-' + Date.now().toString(16) + '-' + Math.random().toString(16).slice(2)
}

function isThenable(x) { return x !== null && (typeof x === 'object' || typeof x === 'function') && typeof x.then === 'function' }

const READ_INTENTS = {
  get_state: 'Read app state', query_state: 'Query app state', list_actions: 'List actions',
  describe_visible_content: 'Describe visible content', describe_context: 'Describe context',
  observe: 'Observe the app',
}

/**
 * Create the agent runtime for this page. See lapd.d.ts for every option.
 * @param {import('./lapd').AgentOptions} opts
 * @returns {import('./lapd').Agent}
 */
export function createAgent(opts) {
  if (!opts || typeof opts.getState !== 'function') throw new TypeError('lapd: createAgent needs getState()')
  const g = globalThis
  const doc = opts.document ?? g.document
  const win = opts.window ?? (typeof g.addEventListener === 'function' ? g : null)
  const fetchFn = opts.fetch ?? (g.fetch && g.fetch.bind(g))
  const WS = opts.WebSocket ?? g.WebSocket
  const storage = opts.storage === undefined ? safeSessionStorage() : opts.storage
  const actions = opts.actions && typeof opts.actions === 'object' ? opts.actions : null
  const app = opts.app || {}
  const basePath = (opts.agentBasePath ?? '/agent').replace(/\/$/, '')
  const base = (opts.baseUrl ?? (g.location ? g.location.origin : '')).replace(/\/$/, '')
  const redact = typeof opts.redact === 'function' ? opts.redact : (s) => s
  const now = () => Date.now()
  // High-resolution clock for stats() (browsers coarsen it, e.g. to 0.1 ms).
  const clock = g.performance && typeof g.performance.now === 'function' ? () => g.performance.now() : now

  let conn = initialConnState()
  let session = loadSession()
  let ws = null // current socket
  let opened = false // did the current socket ever open?
  let reconnectTimer = null
  let reconnectSince = 0 // when the pending reconnect was scheduled
  let heartbeatTimer = null
  let pongTimer = null
  let missedPongs = 0
  let destroyed = false
  let lastSend = null // for describe_context's synthetic hint
  const listeners = new Map()
  const logRing = []
  const confirms = new Map() // confirmId → entry
  const watches = new Map() // id → {path, last}
  let outbox = loadOutbox()
  const idem = loadIdem() // idempotencyKey → {until, result?, running?}
  // Approvals answered here: confirmId → the confirm-resolved frame
  // (bounded, kept across a reload). A confirm-sync that still lists one is
  // answered again instead of shown again: the first answer may have been
  // lost with the socket or a server restart, and the human must not be
  // asked (and the action run) twice.
  const answered = loadAnswered()
  let ui = null

  // ── events ──
  function emit(name, ...args) {
    for (const fn of listeners.get(name) || []) {
      try { fn(...args) } catch (e) { if (name !== 'error') emit('error', e) }
    }
  }
  function on(name, fn) {
    if (!listeners.has(name)) listeners.set(name, new Set())
    listeners.get(name).add(fn)
    return () => listeners.get(name).delete(fn)
  }

  // ── storage ──
  function safeSessionStorage() {
    try { return g.sessionStorage ?? null } catch { return null }
  }
  function loadSession() {
    try {
      const s = storage && JSON.parse(storage.getItem(STORAGE_KEY) || 'null')
      if (s && typeof s.token === 'string' && typeof s.wsUrl === 'string' && (!s.expiresAt || s.expiresAt > now())) return s
    } catch { /* corrupt: ignore */ }
    return null
  }
  // The session this tab keeps (in sessionStorage, across reloads): the
  // token the LLM gets, and the tab secret it never does.
  function sessionFrom(body) {
    const s = { token: body.token, tid: body.tid, lapUrl: body.lapUrl, wsUrl: body.wsUrl, expiresAt: body.expiresAt }
    if (typeof body.tabSecret === 'string') s.tabSecret = body.tabSecret
    return s
  }
  function persist() { try { storage && session && storage.setItem(STORAGE_KEY, JSON.stringify(session)) } catch { /* quota */ } }
  function clearSession() {
    session = null
    outbox = []
    try { for (const k of [STORAGE_KEY, OUTBOX_KEY, IDEM_KEY, ANSWERED_KEY]) storage && storage.removeItem(k) } catch { /* ignore */ }
    idem.clear()
    answered.clear()
  }
  function loadOutbox() {
    try { const o = storage && JSON.parse(storage.getItem(OUTBOX_KEY) || '[]'); return Array.isArray(o) ? o.slice(0, LIMITS.outbox) : [] } catch { return [] }
  }
  function saveOutbox() { try { storage && storage.setItem(OUTBOX_KEY, JSON.stringify(outbox)) } catch { /* ignore */ } }
  function loadAnswered() {
    const m = new Map()
    try {
      const o = storage && JSON.parse(storage.getItem(ANSWERED_KEY) || '[]')
      if (Array.isArray(o)) for (const f of o.slice(-LIMITS.outbox)) if (f && f.t === 'confirm-resolved' && typeof f.confirmId === 'string') m.set(f.confirmId, f)
    } catch { /* corrupt: ignore */ }
    return m
  }
  function saveAnswered() {
    const out = []
    for (const f of answered.values()) {
      let s = ''
      try { s = JSON.stringify(f) } catch { /* unserialisable state */ }
      // a big stateAfter is not kept across a reload; the answer itself is
      out.push(s && s.length <= LIMITS.idempotencyStoredResult ? f : { t: f.t, confirmId: f.confirmId, outcome: f.outcome })
    }
    try { storage && storage.setItem(ANSWERED_KEY, JSON.stringify(out)) } catch { /* quota */ }
  }
  // send_message idempotency keys outlive a reload (sessionStorage), each for
  // the ttl the server sent, so a retried call is never dispatched twice.
  function loadIdem() {
    const m = new Map()
    try {
      const o = storage && JSON.parse(storage.getItem(IDEM_KEY) || '[]')
      if (Array.isArray(o)) for (const e of o.slice(-LIMITS.idempotencyKeys)) {
        if (e && typeof e.key === 'string' && e.until > now()) m.set(e.key, { until: e.until, result: e.result })
      }
    } catch { /* corrupt: ignore */ }
    return m
  }
  function saveIdem() {
    const t = now()
    const out = []
    for (const [key, e] of idem) {
      if (e.until <= t) { idem.delete(key); continue }
      const rec = { key, until: e.until }
      if (e.result !== undefined && e.resultBytes <= LIMITS.idempotencyStoredResult) rec.result = e.result
      out.push(rec)
    }
    try { storage && storage.setItem(IDEM_KEY, JSON.stringify(out)) } catch { /* quota: the in-memory map still holds */ }
  }

  // ── state and changes ──
  function wireState() { return toWire(redact(opts.getState())) }

  // Change source: the app's subscribe(), else polling while someone listens
  // (on after(): a hidden page polls on time too).
  const changeListeners = new Set()
  let unsubscribeApp = null
  let pollTimer = null // the pending poll's cancel
  let polling = null // the running poll chain (a token)
  let lastPolled
  function startChanges() {
    if (unsubscribeApp || polling) return
    if (typeof opts.subscribe === 'function') {
      unsubscribeApp = opts.subscribe(() => { for (const fn of [...changeListeners]) fn() }) || (() => {})
    } else {
      const every = opts.pollMs ?? 50
      const chain = polling = {}
      lastPolled = JSON.stringify(toWire(opts.getState()))
      const poll = () => {
        const s = JSON.stringify(toWire(opts.getState()))
        if (s !== lastPolled) {
          lastPolled = s
          for (const fn of [...changeListeners]) fn()
        }
        if (polling === chain) pollTimer = after(every, poll) // (a listener may have stopped it)
      }
      pollTimer = after(every, poll)
    }
  }
  function stopChangesIfIdle() {
    if (changeListeners.size) return
    if (polling) { polling = null; pollTimer(); pollTimer = null }
    if (unsubscribeApp) { try { unsubscribeApp() } catch { /* ignore */ } unsubscribeApp = null }
  }
  function onChange(fn) {
    changeListeners.add(fn)
    startChanges()
    return () => { changeListeners.delete(fn); stopChangesIfIdle() }
  }

  // ── wire ──
  function send(frame) {
    if (!ws || ws.readyState !== 1) return false
    let s
    try { s = JSON.stringify(frame) } catch (e) { emit('error', e); return false }
    if (s.length > LIMITS.frameBytes) {
      if (frame.t === 'rpc-reply') return send({ t: 'rpc-error', id: frame.id, code: 'internal', detail: 'reply exceeds 4 MiB; read a narrower path' })
      emit('error', new Error(`lapd: ${frame.t} frame over 4 MiB dropped`))
      return false
    }
    ws.send(s)
    return true
  }
  function sendOrQueue(frame) {
    if (frame.t === 'confirm-resolved') {
      answered.delete(frame.confirmId)
      answered.set(frame.confirmId, frame)
      while (answered.size > LIMITS.outbox) answered.delete(answered.keys().next().value)
      saveAnswered()
    }
    if (send(frame)) return
    if (outbox.length >= LIMITS.outbox) outbox.shift()
    outbox.push(frame)
    saveOutbox()
  }

  // ── log ──
  // notes: words for the panel that do not go on the wire (the summary of the
  // msg an entry is about, computed with the state before it ran), by entry id.
  const notes = new Map()
  function addLog(entry, note) {
    logRing.push(entry)
    if (note && typeof entry.id === 'string') notes.set(entry.id, note)
    if (logRing.length > LIMITS.logEntries) { const old = logRing.shift(); if (old) notes.delete(old.id) }
    emit('log', entry)
    if (ui) ui.schedule()
  }

  // ── connection machine driver ──
  function fire(ev) {
    const prev = conn.status
    const next = nextState(conn, ev)
    const effects = next.effects
    conn = { status: next.status, attempt: next.attempt, elapsedMs: next.elapsedMs, error: next.error, message: next.message }
    for (const e of effects) runEffect(e)
    if (conn.status !== prev || ev.type === 'refused' || ev.type === 'mint-failed' || ev.type === 'revoked') {
      emit('status', conn.status, { error: conn.error, message: conn.message })
      if (conn.error && conn.status === 'error') emit('error', Object.assign(new Error(conn.error.detail || conn.error.code), { code: conn.error.code }))
    }
    if (ui) ui.schedule()
  }

  function runEffect(e) {
    switch (e.type) {
      case 'mint': mint(); break
      case 'persist': persist(); break
      case 'open': openSocket(); break
      case 'clear': clearSession(); confirms.clear(); emit('confirm', pendingConfirms()); break
      case 'close': closeSocket(1000); break
      case 'revoke': revokeRemote(); break
      case 'schedule': {
        clearTimeout(reconnectTimer)
        const delay = e.delayMs
        reconnectSince = now()
        reconnectTimer = setTimeout(() => { reconnectTimer = null; fire({ type: 'reconnect-attempt', elapsedMs: delay }) }, delay)
        break
      }
    }
  }

  async function mint() {
    try {
      // {tab:true}: lapd also mints this tab's own secret, which opens its
      // socket and proves the session is ours; the LLM only ever gets the token.
      const res = await fetchFn(`${base}${basePath}/mint`, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: '{"tab":true}' })
      const body = await res.json().catch(() => null)
      if (!res.ok || !body || typeof body.token !== 'string') {
        fire({ type: 'mint-failed', code: `http-${res.status}`, detail: (body && body.error && (body.error.detail || body.error.code)) || res.statusText || '' })
        return
      }
      session = sessionFrom(body)
      fire({ type: 'mint-ok' })
    } catch (e) {
      fire({ type: 'mint-failed', code: 'network', detail: errMessage(e) })
    }
  }

  async function revokeRemote() {
    const s = session
    if (!s || !fetchFn) return
    try {
      const res = await fetchFn(`${base}${basePath}/revoke`, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(s.tabSecret ? { tid: s.tid, tabSecret: s.tabSecret } : { tid: s.tid }) })
      // 404: the session is gone already; 5xx or 429: it is still there.
      if (res && (res.status >= 500 || res.status === 429) && !session) fire({ type: 'revoke-failed' })
    } catch (e) {
      if (!session) fire({ type: 'revoke-failed' })
      emit('error', e)
    }
  }

  function openSocket() {
    closeSocket(1000)
    if (!session || !WS || destroyed) return
    // Credentials ride in Sec-WebSocket-Protocol entries, never in the URL
    // (URLs end up in proxy logs and browser history); lapd answers lapd.v2.
    const protocols = ['lapd.v2', 'lapd.token.' + session.token]
    if (session.tabSecret) protocols.push('lapd.tab.' + session.tabSecret)
    let sock
    try { sock = new WS(session.wsUrl, protocols) } catch (e) { emit('error', e); fire({ type: 'ws-closed', hasToken: true }); return }
    ws = sock
    opened = false
    sock.onopen = () => { if (ws !== sock) return; opened = true; onOpen() }
    sock.onmessage = (ev) => { if (ws !== sock) return; onFrame(ev.data) }
    sock.onerror = () => { /* a close follows */ }
    sock.onclose = (ev) => { if (ws !== sock) return; onClose(ev.code, ev.reason) }
  }

  function closeSocket(code) {
    stopHeartbeat()
    const sock = ws
    ws = null
    if (sock) {
      sock.onopen = sock.onmessage = sock.onclose = sock.onerror = null
      try { sock.close(code) } catch { /* already closed */ }
    }
  }

  function onOpen() {
    send(helloFrame())
    fire({ type: 'ws-opened' })
    // Approvals clicked while the socket was down.
    const queued = outbox
    outbox = []
    saveOutbox()
    for (const f of queued) sendOrQueue(f)
  }

  async function onClose(code, reason) {
    const wasOpen = opened
    ws = null
    stopHeartbeat()
    if (code === 4001) { fire({ type: 'revoked' }); emit('revoked'); return }
    if (code === 4002) { fire({ type: 'close-final', code: 'superseded', detail: 'another connection took over this session' }); return }
    if (code === 4426) { fire({ type: 'close-final', code: 'version', detail: reason || 'this client is too old for the server' }); return }
    if (!wasOpen && session) {
      // Browsers hide the HTTP status of a refused upgrade: ask the LAP side why.
      const verdict = await probe(session)
      if (destroyed || ws) return
      if (verdict) { fire({ type: 'refused', code: verdict.code, detail: verdict.detail }); return }
    }
    fire({ type: 'ws-closed', hasToken: !!session })
  }

  async function probe(s) {
    if (!fetchFn || !s.lapUrl) return null
    try {
      const res = await fetchFn(s.lapUrl.replace(/\/$/, '') + '/describe', { method: 'POST', headers: { Authorization: 'Bearer ' + s.token, 'Content-Type': 'application/json' }, body: '{}' })
      if (res.status === 401 || res.status === 403) {
        const body = await res.json().catch(() => null)
        const code = (body && body.error && body.error.code) || (res.status === 401 ? 'auth-failed' : 'revoked')
        return { code, detail: res.status === 401 ? 'the session token is no longer valid' : 'the session was revoked' }
      }
      if (res.status === 503) {
        const body = await res.json().catch(() => null)
        const r = res.headers.get('X-LLui-Reconnect') || (body && body.error && body.error.reconnect)
        if (r === 'expired' || r === 'revoked' || r === 'unknown') return { code: r === 'revoked' ? 'revoked' : 'expired', detail: `the session is ${r}` }
      }
    } catch { /* network down: keep reconnecting */ }
    return null
  }

  // Heartbeats find a dead socket without waiting for TCP (a lapd node or
  // a network path lost without a reset: the browser would not notice for
  // minutes). A ping that left with nothing queued ahead of it is answered
  // within pongTimeoutMs (a round trip, then lapd answers at once; half a
  // heartbeat when that is shorter), or the socket is dropped and the tab
  // reconnects — through the load balancer, to a live node. A ping behind
  // a large upload (a slow phone link) is not timed: two missed pongs, one
  // heartbeat apart, are the backstop.
  //
  // A page shown again checks its socket at once (beat): after a laptop's
  // sleep, or a hidden page's minute between heartbeats, the socket may be
  // dead, and the human who comes back to the tab learns it in 5 s.
  let beatEvery = 0
  function startHeartbeat(ms) {
    stopHeartbeat()
    if (!(ms > 0)) return
    missedPongs = 0
    beatEvery = Math.max(1000, ms)
    heartbeatTimer = setInterval(() => {
      if (missedPongs >= LIMITS.missedPongs) return dropDeadSocket()
      beat()
    }, beatEvery)
  }
  // beat sends a ping; urgent: a check the page asked for (the network is
  // back), not the heartbeat's schedule.
  function beat(urgent = false) {
    missedPongs++
    const sock = ws
    const idle = !sock || !(sock.bufferedAmount > 0)
    send({ t: 'ping' })
    if (idle && !pongTimer) {
      // Before the next ping: one unanswered ping decides. In a hidden
      // page the browser may run the page's timers once a minute: the
      // pong is then timed on the worker, made for an urgent check (a
      // worker per hidden tab for its heartbeat alone would cost more
      // than it finds).
      pongTimer = after(Math.min(LIMITS.pongTimeoutMs, beatEvery / 2), () => {
        pongTimer = null
        if (ws === sock && missedPongs > 0) dropDeadSocket()
      }, urgent)
    }
  }
  function dropDeadSocket() {
    const sock = ws
    closeSocket(4000)
    if (sock) fire({ type: 'ws-closed', hasToken: !!session })
  }
  function stopPongTimer() { if (pongTimer) { pongTimer(); pongTimer = null } }
  function stopHeartbeat() {
    stopPongTimer()
    if (heartbeatTimer) { clearInterval(heartbeatTimer); heartbeatTimer = null }
  }

  function helloFrame() {
    const msgSchema = actions ? buildMsgSchema(actions) : null
    const policy = buildPolicy(actions)
    const stateSchema = opts.stateSchema ?? null
    let sample = []
    try { sample = typeof opts.affordances === 'function' ? toWire(opts.affordances(redact(opts.getState()))) || [] : [] } catch { sample = [] }
    const frame = {
      t: 'hello', appName: String(app.name || 'app'), appVersion: String(app.version || '0'),
      msgSchema, stateSchema, affordancesSample: Array.isArray(sample) ? sample.slice(0, 50) : [],
      docs: opts.docs ?? null, schemaHash: fnv1a(JSON.stringify([msgSchema, stateSchema, policy])),
      lapVersion: LAP_VERSION, visible: isVisible(),
    }
    if (policy) frame.policy = policy
    return frame
  }

  function isVisible() { return doc && doc.visibilityState ? doc.visibilityState === 'visible' : true }

  // after(ms, fn) calls fn once, ms from now, and returns a cancel function.
  // A browser runs a hidden page's timers at most once a second (Chrome,
  // Safari, Firefox), and the user who pasted the connect line into Claude
  // in another tab has hidden this one: every send_message's drain wait
  // (100 ms) took a second. A dedicated worker's timers are not throttled,
  // so while the page is hidden the wait also runs in one (made on first
  // need, from a blob: URL); setTimeout runs beside it and wins when the
  // worker cannot start (a CSP without worker-src blob:, no Worker).
  // after(ms, fn, false) uses the worker only when one was made already.
  let timerWorker = null // null: not tried; false: not available
  let timerSeq = 0
  const timerWaits = new Map() // id → fire
  function workerTimer(make = true) {
    if (timerWorker !== null || !make) return timerWorker || null
    timerWorker = false
    try {
      if (typeof g.Worker !== 'function' || typeof g.Blob !== 'function' || !g.URL || typeof g.URL.createObjectURL !== 'function') return null
      const url = g.URL.createObjectURL(new g.Blob(['onmessage = (e) => setTimeout(() => postMessage(e.data[0]), e.data[1])'], { type: 'text/javascript' }))
      const w = new g.Worker(url)
      w.onmessage = (e) => {
        const fire = timerWaits.get(e.data)
        if (fire) fire()
      }
      w.onerror = () => { // did not start (CSP): the setTimeouts carry on
        if (timerWorker === w) timerWorker = false
        try { w.terminate() } catch { /* gone */ }
        try { g.URL.revokeObjectURL(url) } catch { /* gone */ }
      }
      w.url = url
      timerWorker = w
    } catch { timerWorker = false }
    return timerWorker || null
  }
  function stopTimerWorker() {
    const w = timerWorker
    timerWorker = false
    timerWaits.clear()
    if (w) {
      try { w.terminate() } catch { /* gone */ }
      try { g.URL.revokeObjectURL(w.url) } catch { /* gone */ }
    }
  }
  function after(ms, fn, make = true) {
    let done = false
    let id = 0
    const cancel = () => {
      done = true
      clearTimeout(t)
      if (id) timerWaits.delete(id)
    }
    const fire = () => {
      if (done) return
      cancel()
      fn()
    }
    const t = setTimeout(fire, ms)
    const w = !isVisible() && !destroyed ? workerTimer(make) : null
    if (w) {
      id = ++timerSeq
      timerWaits.set(id, fire)
      try { w.postMessage([id, ms]) } catch { timerWaits.delete(id); id = 0 }
    }
    return cancel
  }

  // ── frames from the server ──
  function onFrame(data) {
    const t0 = clock()
    let f
    try { f = JSON.parse(data) } catch { return }
    if (!f || typeof f.t !== 'string') return
    switch (f.t) {
      case 'rpc': handleRpc(f, t0); break
      case 'hello-ack': startHeartbeat(f.heartbeatMs); break
      case 'pong': missedPongs = 0; stopPongTimer(); break
      // A re-pair before any model used the token says so ("model":false):
      // the human still has to paste the line, so the panel keeps asking.
      case 'active': if (f.model !== false) { fire({ type: 'activated' }); emit('active') } break
      case 'revoked': fire({ type: 'revoked' }); emit('revoked'); break
      case 'log-push': if (f.entry && typeof f.entry === 'object') { addLog(f.entry); send({ t: 'log-append', entry: f.entry }) } break
      // An entry the server already recorded (e.g. a dispatch its policy refused): show it, do not echo it.
      case 'log-show': if (f.entry && typeof f.entry === 'object') addLog(f.entry); break
      case 'confirm-expire': expireConfirm(f.confirmId, f.reason); break
      case 'confirm-sync': syncConfirms(f.pending); break
      case 'watch': addWatch(f.id, f.path); break
      case 'unwatch': removeWatch(f.id); break
    }
  }

  // ── watches ──
  let unwatchChanges = null
  function addWatch(id, path) {
    if (typeof id !== 'string') return
    if (!watches.has(id) && watches.size >= LIMITS.watches) watches.delete(watches.keys().next().value)
    const p = typeof path === 'string' ? path : ''
    watches.set(id, { path: p, last: JSON.stringify(resolvePointer(wireState(), p)) ?? 'undefined' })
    if (!unwatchChanges) unwatchChanges = onChange(checkWatches)
  }
  function removeWatch(id) {
    watches.delete(id)
    if (!watches.size && unwatchChanges) { unwatchChanges(); unwatchChanges = null }
  }
  function checkWatches() {
    if (!watches.size) return
    const st = wireState()
    for (const [id, w] of watches) {
      const cur = JSON.stringify(resolvePointer(st, w.path)) ?? 'undefined'
      if (cur !== w.last) { w.last = cur; send({ t: 'state-update', id, path: w.path, stateAfter: st }) }
    }
  }

  // ── rpc ──
  // Cost accounting for stats(): wall time from a frame's arrival (before
  // JSON.parse) to the end of its handling (reply and log-append sent),
  // minus meta.excludedMs (the app's handler and the drain wait, which
  // sendMessage measures around runDispatch).
  let rpcCount = 0
  let rpcHandleMsTotal = 0
  const rpcSamples = [] // ring of the last LIMITS.statsSamples timings
  function recordRpc(ms) {
    const v = Math.max(0, ms)
    if (rpcSamples.length >= LIMITS.statsSamples) rpcSamples.splice(0, rpcSamples.length - LIMITS.statsSamples + 1)
    rpcSamples.push(v)
    rpcCount++
    rpcHandleMsTotal += v
  }
  function stats() {
    const sorted = rpcSamples.slice().sort((a, b) => a - b)
    const p50 = sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : 0
    return { rpcCount, rpcHandleMsTotal, rpcHandleMsP50: p50 }
  }

  async function handleRpc(f, t0 = clock()) {
    const meta = { excludedMs: 0 }
    try { await handleRpcTimed(f, meta) } finally { recordRpc(clock() - t0 - meta.excludedMs) }
  }

  async function handleRpcTimed(f, meta) {
    const id = typeof f.id === 'string' ? f.id : null
    if (!id || typeof f.tool !== 'string') { if (id) send({ t: 'rpc-error', id, code: 'schema-error', detail: 'rpc frame needs id and tool' }); return }
    const args = f.args && typeof f.args === 'object' ? f.args : {}
    const tool = tools[f.tool]
    if (!own(tools, f.tool)) {
      send({ t: 'rpc-error', id, code: 'invalid', detail: `unknown tool: ${f.tool}` })
      return
    }
    let result
    let note
    let entry = { id, at: now(), kind: 'read', intent: READ_INTENTS[f.tool] || f.tool }
    try {
      const r = await tool(args, meta)
      result = r.result
      if (r.log) entry = { ...entry, ...r.log }
      note = r.note
      send({ t: 'rpc-reply', id, result })
    } catch (e) {
      const code = e && e.code ? e.code : 'internal'
      send({ t: 'rpc-error', id, code, detail: errMessage(e) })
      entry = { ...entry, kind: 'error', detail: errMessage(e) }
    }
    send({ t: 'log-append', entry })
    addLog(entry, note)
  }

  function invalid(detail) { return Object.assign(new Error(detail), { code: 'invalid' }) }

  function domRoot() { return opts.root ?? (doc && doc.body) ?? null }
  function visibleBinding(name) {
    const root = domRoot()
    if (!root || typeof root.querySelector !== 'function') return false
    const sel = `[data-agent="${String(name).replace(/"/g, '\\"')}"]`
    const el = root.querySelector(sel)
    return !!el && !el.disabled && !isHidden(el)
  }
  function currentActions() {
    const st = opts.getState()
    let aff = null
    try { aff = typeof opts.affordances === 'function' ? opts.affordances(st) : null } catch { aff = null }
    return listActions(actions, st, { affordances: aff, visible: visibleBinding })
  }
  function currentContext() {
    let ctx = null
    try { ctx = typeof opts.context === 'function' ? opts.context(redact(opts.getState())) : null } catch (e) { ctx = { summary: '', cautions: [`context() threw: ${errMessage(e)}`] } }
    ctx = ctx && typeof ctx === 'object' ? { ...ctx } : { summary: '' }
    if (lastSend) {
      let hint = null
      if (lastSend.status === 'rejected') hint = `Your last send_message (${lastSend.variant}) was rejected: ${lastSend.detail}`
      else if (lastSend.threw) hint = `Your last send_message (${lastSend.variant}) threw: ${lastSend.detail}`
      else if (lastSend.errors) hint = `Your last send_message (${lastSend.variant}) dispatched but its effects reported errors: ${lastSend.detail}`
      if (hint) ctx.hints = [hint, ...(Array.isArray(ctx.hints) ? ctx.hints : [])]
    }
    return toWire(ctx)
  }

  const tools = {
    get_state(args) {
      return { result: { state: resolvePointer(wireState(), typeof args.path === 'string' ? args.path : '') } }
    },
    query_state(args) {
      if (typeof args.path !== 'string') throw invalid('path must be a string')
      return { result: resolvePointer(wireState(), args.path, { strict: true }), log: { intent: `Query state: ${args.path}` } }
    },
    list_actions() { return { result: { actions: currentActions() } } },
    observe() { return { result: { state: wireState(), actions: currentActions(), context: typeof opts.context === 'function' || lastSend ? currentContext() : null } } },
    describe_context() { return { result: { context: currentContext() } } },
    query_dom(args) {
      if (typeof args.name !== 'string') throw invalid('name must be a string')
      return { result: { elements: queryDom(domRoot(), args.name, !!args.multiple) }, log: { intent: `Query DOM: ${args.name}` } }
    },
    describe_visible_content() {
      const o = outline(domRoot())
      return { result: { url: g.location ? g.location.href : null, outline: o.outline, source: o.source } }
    },
    would_dispatch(args) {
      const msg = args.msg
      const gate = gateMessage(actions, msg)
      const log = { intent: `Predict: ${msg && msg.type}`, variant: msg && msg.type }
      if (gate) {
        if (gate.errors) return { result: { status: 'rejected', reason: 'schema-mismatch', errors: gate.errors.map((e) => ({ path: referencePath(e.path, msg), code: e.code, message: e.message, pointer: e.path })) }, log }
        return { result: gate, log }
      }
      if (typeof opts.reducer !== 'function')
        return { result: { status: 'rejected', reason: 'unsupported', detail: 'this app has no pure reducer; use send_message' }, log }
      const before = opts.getState()
      try {
        const copy = structuredCloneSafe(before)
        const after = opts.reducer(copy, fromWire(msg))
        return { result: { status: 'predicted', stateDiff: computeStateDiff(toWire(redact(before)), toWire(redact(after))), effects: [] }, log }
      } catch (e) {
        return { result: { status: 'reducer-threw', message: errMessage(e), ...(e && e.stack ? { stack: String(e.stack).slice(0, 2000) } : {}) }, log }
      }
    },
    async send_message(args, meta) { return sendMessage(args, meta) },
  }

  function structuredCloneSafe(v) {
    try { return typeof g.structuredClone === 'function' ? g.structuredClone(v) : fromWire(toWire(v)) } catch { return fromWire(toWire(v)) }
  }

  // Run the app's side of a msg: the action's handler, else dispatch(msg).
  function dispatchApp(msg) {
    const a = actions && own(actions, msg.type) ? actions[msg.type] : null
    if (a && typeof a.handler === 'function') {
      return a.handler(payloadOf(msg), { state: opts.getState(), dispatch: (m) => dispatchApp(m), source: 'agent', msg })
    }
    if (typeof opts.dispatch === 'function') return opts.dispatch(msg)
    throw new Error(`no handler for "${msg.type}" and no dispatch()`)
  }

  /** Dispatch and wait per waitFor; returns the drain report. */
  async function runDispatch(msg, { waitFor, drainQuietMs, timeoutMs }) {
    const start = now()
    const errors = []
    let effects = 0
    let dirty = false
    let wake = null
    const poke = () => { dirty = true; if (wake) { const w = wake; wake = null; w() } }
    const pushErr = (kind, e) => {
      if (errors.length < LIMITS.drainErrors) errors.push({ kind, message: errMessage(e), ...(e && e.stack ? { stack: String(e.stack).slice(0, 1000) } : {}) })
    }
    const inflight = new Set()
    const track = (p) => {
      inflight.add(p)
      Promise.resolve(p).then(() => { effects++ }, (e) => pushErr('unhandledrejection', e)).finally(() => { inflight.delete(p); poke() })
    }
    const onErr = (ev) => pushErr('error', ev.error || ev.message || ev)
    const onRej = (ev) => pushErr('unhandledrejection', ev.reason)
    const watching = waitFor !== 'none' && win
    if (watching) { win.addEventListener('error', onErr); win.addEventListener('unhandledrejection', onRej) }
    const unsub = waitFor === 'drained' ? onChange(() => { effects++; poke() }) : null
    let timedOut = false
    try {
      try {
        const r = dispatchApp(msg)
        if (isThenable(r)) track(r)
      } catch (e) { pushErr('error', e) }
      if (waitFor === 'idle') {
        await Promise.resolve()
      } else if (waitFor === 'drained') {
        for (;;) {
          if (dirty) { dirty = false; continue }
          const remaining = timeoutMs - (now() - start)
          if (remaining <= 0) { timedOut = true; break }
          const windowMs = Math.min(drainQuietMs, remaining)
          let cancel
          const woke = await new Promise((res) => { wake = () => res(true); cancel = after(windowMs, () => { wake = null; res(false) }) })
          cancel()
          if (woke || dirty) { dirty = false; continue }
          if (inflight.size) continue // effects still running
          if (windowMs < drainQuietMs) timedOut = true
          break
        }
      }
    } finally {
      if (unsub) unsub()
      if (watching) { win.removeEventListener('error', onErr); win.removeEventListener('unhandledrejection', onRej) }
    }
    return { effectsObserved: waitFor === 'none' ? 0 : effects, durationMs: now() - start, timedOut, errors }
  }

  // send_message with an idempotencyKey runs once per key: a repeat while
  // the first runs gets its answer, a later one its kept result, and one
  // whose result is not kept (too big, or lost with a reload mid-dispatch)
  // an outcome-unknown error, never a second dispatch. The key is recorded
  // before anything runs.
  async function sendMessage(args, meta) {
    const key = typeof args.idempotencyKey === 'string' && args.idempotencyKey && args.idempotencyKey.length <= 200 ? args.idempotencyKey : null
    if (!key) return sendMessageOnce(args, meta)
    const seen = idem.get(key)
    if (seen && seen.until > now()) {
      const variant = args.msg && typeof args.msg.type === 'string' ? args.msg.type : undefined
      const log = { variant, intent: `Repeated request for ${variant} (same idempotencyKey): not dispatched again`, kind: 'read' }
      if (seen.running) return { result: (await seen.running).result, log }
      if (seen.result !== undefined) return { result: seen.result, log }
      throw Object.assign(new Error('this request (same idempotencyKey) was already dispatched in this tab, but its result is not kept; observe before retrying'), { code: 'outcome-unknown' })
    }
    const ttl = clampNum(args.idempotencyTtlMs, 10 * 60 * 1000, 1000, 24 * 3600 * 1000)
    const entry = { until: now() + ttl }
    idem.set(key, entry)
    while (idem.size > LIMITS.idempotencyKeys) idem.delete(idem.keys().next().value)
    saveIdem() // write-ahead: a reload from here on knows the key was used
    entry.running = sendMessageOnce(args, meta)
    try {
      const r = await entry.running
      let bytes = Infinity
      try { bytes = JSON.stringify(r.result).length } catch { /* not kept */ }
      if (bytes <= LIMITS.idempotencyKeptResult) { entry.result = r.result; entry.resultBytes = bytes }
      return r
    } finally {
      entry.running = null
      saveIdem()
    }
  }

  async function sendMessageOnce(args, meta) {
    const msg = args.msg && typeof args.msg === 'object' ? fromWire(args.msg) : args.msg
    const variant = msg && typeof msg.type === 'string' ? msg.type : undefined
    const a = actions && variant && own(actions, variant) ? actions[variant] : null
    const base = { variant, intent: (a && a.intent) || variant, detail: msgDetail(msg) }
    // The panel's words for this msg, from the state it is dispatched against.
    const note = variant ? { summary: describeMsg(actions, msg, opts.getState()) } : undefined
    const gate = gateMessage(actions, msg)
    if (gate) {
      lastSend = { status: 'rejected', variant, detail: gate.detail }
      return { result: gate, log: { ...base, kind: 'blocked', detail: `${gate.reason}: ${gate.detail}` }, note }
    }
    if (a && a.requiresConfirm) {
      if (pendingConfirms().length >= LIMITS.pendingConfirms)
        return { result: { status: 'rejected', reason: 'invalid', detail: 'too many approvals are waiting; ask the user to answer them first' }, log: { ...base, kind: 'blocked' }, note }
      const entry = {
        id: uuid(), variant, payload: toWire(payloadOf(msg)), intent: a.intent || variant,
        reason: typeof args.reason === 'string' ? args.reason.slice(0, 500) : null, proposedAt: now(), status: 'pending',
      }
      confirms.set(entry.id, entry)
      emit('confirm', pendingConfirms(), entry)
      lastSend = { status: 'pending-confirmation', variant }
      return { result: { status: 'pending-confirmation', confirmId: entry.id }, log: { ...base, kind: 'proposed', confirmId: entry.id }, note }
    }
    const waitFor = ['none', 'idle', 'drained'].includes(args.waitFor) ? args.waitFor : 'drained'
    const drainQuietMs = clampNum(args.drainQuietMs, 100, 0, 10000)
    const timeoutMs = clampNum(args.timeoutMs, 5000, 0, 60000)
    const before = wireState()
    const td = clock()
    const drain = await runDispatch(msg, { waitFor, drainQuietMs, timeoutMs })
    if (meta) meta.excludedMs += clock() - td
    const afterState = wireState()
    const stateDiff = computeStateDiff(before, afterState)
    lastSend = drain.errors.length
      ? { status: 'dispatched', variant, errors: true, detail: drain.errors.map((e) => e.message).join('; ') }
      : { status: 'dispatched', variant }
    const result = { status: 'dispatched', stateDiff, actions: currentActions(), drain }
    if (args.includeState === true) result.stateAfter = afterState
    return { result, log: { ...base, kind: 'dispatched', stateDiff }, note }
  }

  function clampNum(v, dflt, min, max) {
    return typeof v === 'number' && Number.isFinite(v) ? Math.min(Math.max(v, min), max) : dflt
  }

  // ── confirms ──
  function pendingConfirms() { return [...confirms.values()].filter((c) => c.status === 'pending') }
  // What an approval would do, in words, against the current state.
  function confirmSummary(c) {
    return describeMsg(actions, { ...fromWire(c.payload || {}), type: c.variant }, opts.getState(), c.intent)
  }

  // Every approval is gated again right before it runs, whatever frame
  // brought it (our own proposal, or a confirm-sync after a reload): an
  // unknown or human-only variant, or a payload that fails its schema, is
  // never dispatched; it is answered as rejected instead.
  function approvalMsg(c) { return { ...fromWire(c.payload && typeof c.payload === 'object' ? c.payload : {}), type: c.variant } }
  function refuseApproval(c, gate) {
    confirms.delete(c.id)
    sendOrQueue({ t: 'confirm-resolved', confirmId: c.id, outcome: 'user-cancelled' })
    addLog({ id: `confirm-${c.id}`, at: now(), kind: 'blocked', variant: c.variant, intent: c.intent, confirmId: c.id, detail: `approval refused: ${gate.reason}: ${gate.detail}` })
    emit('confirm', pendingConfirms(), { ...c, status: 'rejected', reason: gate.reason })
  }

  async function approve(confirmId) {
    const c = confirms.get(confirmId)
    if (!c || c.status !== 'pending') return false
    const msg = approvalMsg(c)
    const gate = gateMessage(actions, msg)
    if (gate) { refuseApproval(c, gate); return false }
    c.status = 'approved'
    emit('confirm', pendingConfirms(), c)
    const note = { summary: confirmSummary(c) }
    const drain = await runDispatch(msg, { waitFor: 'drained', drainQuietMs: 100, timeoutMs: 2000 })
    confirms.delete(confirmId)
    const stateAfter = wireState()
    sendOrQueue({ t: 'confirm-resolved', confirmId, outcome: 'confirmed', stateAfter })
    addLog({ id: `confirm-${confirmId}`, at: now(), kind: 'confirmed', variant: c.variant, intent: c.intent, confirmId, detail: drain.errors.length ? `errors: ${drain.errors.map((e) => e.message).join('; ')}` : 'approved by the user' }, note)
    return true
  }

  function reject(confirmId) {
    const c = confirms.get(confirmId)
    if (!c || c.status !== 'pending') return false
    const note = { summary: confirmSummary(c) }
    confirms.delete(confirmId)
    sendOrQueue({ t: 'confirm-resolved', confirmId, outcome: 'user-cancelled' })
    addLog({ id: `confirm-${confirmId}`, at: now(), kind: 'rejected', variant: c.variant, intent: c.intent, confirmId, detail: 'rejected by the user' }, note)
    emit('confirm', pendingConfirms(), { ...c, status: 'rejected' })
    return true
  }

  function expireConfirm(confirmId, reason) {
    const c = confirms.get(confirmId)
    if (!c || c.status !== 'pending') return
    const note = { summary: confirmSummary(c) }
    confirms.delete(confirmId)
    addLog({ id: `confirm-${confirmId}`, at: now(), kind: 'rejected', variant: c.variant, intent: c.intent, confirmId, detail: `expired${reason ? ` (${reason})` : ''}` }, note)
    emit('confirm', pendingConfirms(), { ...c, status: 'rejected', reason: reason || 'expired' })
  }

  function syncConfirms(pending) {
    if (!Array.isArray(pending)) return
    let changed = false
    for (const p of pending.slice(0, LIMITS.pendingConfirms)) {
      if (!p || typeof p.confirmId !== 'string') continue
      const known = confirms.get(p.confirmId)
      if (known) {
        // One this tab proposed itself does not know lapd's deadline: a
        // confirm-sync that carries it lets the card say when it expires.
        if (known.status === 'pending' && known.expiresAt == null && typeof p.expiresAt === 'number') { known.expiresAt = p.expiresAt; changed = true }
        continue
      }
      if (answered.has(p.confirmId)) {
        // answered here, still pending there: the answer was lost on the way
        if (!outbox.some((f) => f.t === 'confirm-resolved' && f.confirmId === p.confirmId)) sendOrQueue(answered.get(p.confirmId))
        continue
      }
      const a = actions && typeof p.variant === 'string' && own(actions, p.variant) ? actions[p.variant] : null
      const c = {
        id: p.confirmId, variant: p.variant, payload: p.payload ?? {}, intent: p.intent || (a && a.intent) || p.variant,
        reason: p.reason ?? null, proposedAt: p.proposedAt ?? now(), expiresAt: p.expiresAt, status: 'pending',
      }
      const gate = gateMessage(actions, approvalMsg(c))
      if (gate) { refuseApproval(c, gate); continue } // never shown: it could not run anyway
      confirms.set(p.confirmId, c)
      changed = true
    }
    if (changed) { emit('confirm', pendingConfirms()); if (ui) ui.schedule() }
  }

  // ── visibility and network ──
  // The network is back (a Wi-Fi hand-over, a train out of a tunnel): a
  // tab waiting out its reconnect backoff (up to 30 s) tries at once, and
  // an open socket is checked, since it may not have survived the change.
  const onOnline = () => {
    if (destroyed) return
    if (conn.status === 'reconnecting' && reconnectTimer) {
      clearTimeout(reconnectTimer)
      reconnectTimer = null
      fire({ type: 'reconnect-attempt', elapsedMs: Math.max(0, now() - reconnectSince) })
    } else if (heartbeatTimer && !pongTimer && ws && ws.readyState === 1) beat(true)
  }
  if (win) win.addEventListener('online', onOnline)
  const onVisibility = () => {
    send({ t: 'visibility', visible: isVisible() })
    if (isVisible() && heartbeatTimer && !pongTimer && ws && ws.readyState === 1) beat()
  }
  if (doc && typeof doc.addEventListener === 'function') doc.addEventListener('visibilitychange', onVisibility)

  // ── public API ──
  const agent = {
    get status() { return conn.status },
    get error() { return conn.error },
    get message() { return conn.message },
    get session() { return session ? { tid: session.tid, lapUrl: session.lapUrl, expiresAt: session.expiresAt } : null },
    get connectLine() { return session && session.lapUrl ? connectLine(session.lapUrl, session.token) : null },
    connect() {
      if (destroyed) return
      if (conn.status === 'reconnecting') { clearTimeout(reconnectTimer); fire({ type: 'reconnect-attempt', elapsedMs: 0 }); return }
      if (conn.status !== 'idle' && conn.status !== 'error' && conn.status !== 'failed') return
      session = session || loadSession()
      if (session) fire({ type: 'restore' })
      else fire({ type: 'mint' })
    },
    disconnect() {
      clearTimeout(reconnectTimer)
      fire({ type: 'disconnect' })
    },
    async listResumable(tids) {
      const res = await fetchFn(`${base}${basePath}/resume/list`, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ tids: (tids || []).slice(0, 50) }) })
      const body = await res.json().catch(() => null)
      if (!res.ok) throw Object.assign(new Error(`resume/list failed: HTTP ${res.status}`), { code: body && body.error && body.error.code })
      return (body && body.sessions) || []
    },
    async resume(tid) {
      try {
        // An anonymous session is claimed with its tab secret (the one this tab holds, if it is that session).
        const claim = session && session.tid === tid && session.tabSecret ? { tid, tabSecret: session.tabSecret } : { tid }
        const res = await fetchFn(`${base}${basePath}/resume/claim`, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(claim) })
        const body = await res.json().catch(() => null)
        if (!res.ok || !body || typeof body.token !== 'string') {
          const code = (body && body.error && body.error.code) || `http-${res.status}`
          emit('error', Object.assign(new Error(`resume failed: ${code}`), { code }))
          return false
        }
        clearTimeout(reconnectTimer)
        session = sessionFrom(body)
        fire({ type: 'resume-ok' })
        return true
      } catch (e) { emit('error', e); return false }
    },
    on,
    approve,
    reject,
    pendingConfirms: () => pendingConfirms().map((c) => ({ ...c, summary: confirmSummary(c) })),
    log: () => logRing.slice(),
    stats,
    destroy() {
      destroyed = true
      clearTimeout(reconnectTimer)
      stopTimerWorker()
      closeSocket(1000)
      watches.clear()
      changeListeners.clear()
      stopChangesIfIdle()
      if (doc && typeof doc.removeEventListener === 'function') doc.removeEventListener('visibilitychange', onVisibility)
      if (win) win.removeEventListener('online', onOnline)
      if (ui) ui.remove()
      ui = null
      listeners.clear()
    },
  }

  if (opts.ui !== false && doc && typeof doc.createElement === 'function') {
    ui = createPanel(agent, doc, win, opts.ui && typeof opts.ui === 'object' ? opts.ui : {}, {
      feed: () => {
        const entries = logRing.slice(-LIMITS.feedItems)
        if (!pendingConfirms().length) return feedItems(entries, notes)
        // A waiting approval's line says what the card says: against the state now.
        const live = new Map(notes)
        for (const e of entries) {
          const c = e && e.kind === 'proposed' ? confirms.get(e.confirmId) : null
          if (c && c.status === 'pending') live.set(e.id, { summary: confirmSummary(c) })
        }
        return feedItems(entries, live)
      },
      describe: (entry) => feedItems([entry], notes)[0],
      onState: onChange,
    })
  }
  // Restore a session kept across a reload (no new mint).
  if (opts.autoRestore !== false && session) queueMicrotask(() => { if (!destroyed && conn.status === 'idle' && session) fire({ type: 'restore' }) })
  return agent
}

// ───────────────────────────── panel (Shadow DOM) ─────────────────────────────
//
// One fixed panel: at the bottom right on a wide screen; on a narrow one
// (≤ 640 px) a bottom sheet, collapsed to one line with a badge until the
// human opens it, at most half the screen high, with buttons of at least
// 44×44 px. The page keeps room below its content as tall as the panel (on a
// wide screen while an approval waits), so everything can be scrolled above it.
//
// Keyboard: Alt+Shift+A (ui.shortcut), or the skip link that is the page's
// first Tab stop, moves focus to the panel's next action (Approve, Connect,
// Copy); Escape goes back to where you were. Re-rendering keeps focus on the
// control you used, or on the panel's bar when that control went away.
// Screen readers hear status changes, new approvals and new activity through
// one polite live region that is created once and never rebuilt.

const STATUS_TEXT = {
  idle: 'Not connected', minting: 'Connecting…', 'pending-claude': 'Waiting for the AI',
  active: 'AI connected', reconnecting: 'Reconnecting…', failed: 'Connection lost', error: 'Could not connect',
}
const DOT = { idle: '#6e7781', minting: '#bf8700', 'pending-claude': '#bf8700', active: '#1a7f37', reconnecting: '#bf8700', failed: '#cf222e', error: '#cf222e' }
const ERROR_WORDS = {
  'auth-failed': 'The session is no longer valid; connect again for a new one.',
  revoked: 'The session was revoked; connect again for a new one.',
  expired: 'The session expired; connect again for a new one.',
  superseded: 'This session was opened somewhere else.',
  version: 'This page is older than the server; reload it.',
  network: 'lapd could not be reached; is it running?',
  'http-401': 'Sign in to the app first (anonymous connections are off on this server).',
  'http-429': 'Too many attempts; wait a minute and try again.',
}
const NARROW = '(max-width: 640px)'
const COPY_BY_HAND = 'The line is selected: press Ctrl+C (⌘C on a Mac), or long-press it on a phone.'
export const DEFAULT_SHORTCUT = 'Alt+Shift+A'

// The panel's colours: light, and dark when the system asks for it (or
// ui.theme does). Each pair meets WCAG AA contrast (4.5:1 for its text).
const LIGHT = `--fg: #1f2328; --bg: #fff; --line: #d0d7de; --subtle: #f6f8fa; --hover: #eaeef2; --muted: #59636e; --accent: #0969da;
  --link: #0859c2; --primary: #0969da; --primary-hover: #0860ca; --danger: #c21c2c; --badge: #cf222e; --card-line: #d4a72c;
  --wait: #fff8c5; --ok: #dafbe1; --bad: #ffebe9; --info: #ddf4ff; --det: #424a53; --shadow: rgba(0,0,0,.18); color-scheme: light;`
const DARK = `--fg: #e6edf3; --bg: #161b22; --line: #30363d; --subtle: #21262d; --hover: #30363d; --muted: #9198a1; --accent: #4493f8;
  --link: #4493f8; --primary: #0969da; --primary-hover: #0860ca; --danger: #ff7b72; --badge: #da3633; --card-line: #9e6a03;
  --wait: #3a2d0b; --ok: #12361f; --bad: #3d1518; --info: #0c2d4a; --det: #b0b8c1; --shadow: rgba(0,0,0,.6); color-scheme: dark;`

const PANEL_CSS = `
:host { all: initial; display: block; }
* { box-sizing: border-box; }
.p { ${LIGHT} }
@media (prefers-color-scheme: dark) { :host(:not([data-theme="light"])) .p { ${DARK} } }
:host([data-theme="dark"]) .p { ${DARK} }
.p { position: fixed; right: 16px; bottom: 16px; z-index: 2147483000; width: 340px; max-height: min(70vh, 680px);
  display: flex; flex-direction: column; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); border: 1px solid var(--line); border-radius: 12px; box-shadow: 0 8px 24px var(--shadow); overflow: hidden; }
.toggle { display: flex; align-items: center; gap: 8px; width: 100%; min-height: 44px; padding: 8px 12px; border: 0; border-radius: 0;
  background: var(--subtle); border-bottom: 1px solid var(--line); text-align: left; font-weight: 600; }
.collapsed .toggle { border-bottom: 0; }
.dot { width: 10px; height: 10px; border-radius: 50%; flex: none; }
.t { flex: 1; min-width: 0; overflow-wrap: anywhere; }
.badge { flex: none; min-width: 22px; padding: 1px 7px; border-radius: 11px; background: var(--badge); color: #fff; font-size: 12px; text-align: center; }
.chev { flex: none; color: var(--muted); transition: transform .15s; }
.collapsed .chev { transform: rotate(180deg); }
.b { padding: 12px; overflow: auto; display: flex; flex-direction: column; gap: 10px; overscroll-behavior: contain; }
.b > * { flex-shrink: 0; }
.b[hidden] { display: none; }
.b > div:empty { display: none; }
.sec { display: flex; flex-direction: column; gap: 8px; }
p { margin: 0; }
button { font: inherit; min-height: 36px; border: 1px solid var(--line); background: var(--subtle); color: var(--fg); border-radius: 8px; padding: 6px 14px; cursor: pointer; }
button:hover { background: var(--hover); }
.toggle:hover { background: var(--hover); }
:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
.toggle:focus-visible { outline-offset: -3px; }
button.primary { background: var(--primary); border-color: var(--primary); color: #fff; }
button.primary:hover { background: var(--primary-hover); }
button.danger { color: var(--danger); }
button.link { border: 0; background: none; padding: 4px 6px; min-height: 32px; color: var(--link); text-decoration: underline; }
.line { display: flex; gap: 6px; align-items: stretch; }
input.cl { flex: 1; min-width: 0; font: 13px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; color: var(--fg); background: var(--subtle);
  border: 1px solid var(--line); border-radius: 8px; padding: 6px 8px; white-space: nowrap; text-overflow: clip; }
.err { color: var(--danger); }
.muted { color: var(--muted); }
.small { font-size: 12px; }
h3 { margin: 0; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
.hrow { display: flex; align-items: center; justify-content: space-between; gap: 8px; }
.card { border: 1px solid var(--card-line); background: var(--wait); border-radius: 10px; padding: 10px; display: flex; flex-direction: column; gap: 6px; overflow-wrap: anywhere; }
.ask strong { font-size: 15px; }
dl { margin: 0; display: grid; grid-template-columns: auto 1fr; gap: 2px 8px; font-size: 13px; }
dt { color: var(--muted); }
dd { margin: 0; overflow-wrap: anywhere; }
.row { display: flex; gap: 8px; flex-wrap: wrap; }
.row button { flex: 1 1 auto; }
ul.feed { list-style: none; margin: 0; padding: 2px; display: flex; flex-direction: column; gap: 4px; max-height: 200px; overflow: auto; border-radius: 8px; }
li { padding: 6px 8px; border-radius: 8px; background: var(--subtle); overflow-wrap: anywhere; }
li.ok { background: var(--ok); }
li.bad { background: var(--bad); }
li.wait { background: var(--wait); }
li.narrate { background: var(--info); }
li.read { background: none; color: var(--muted); padding: 2px 8px; }
.lbl { font-weight: 600; }
time { color: var(--muted); font-size: 12px; white-space: nowrap; }
.det { margin: 4px 0 0; font: 12px/1.4 ui-monospace, monospace; white-space: pre-wrap; color: var(--det); }
.sr { position: absolute; width: 1px; height: 1px; margin: -1px; padding: 0; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; border: 0; }
.narrow.p { left: 0; right: 0; bottom: 0; width: auto; max-height: 50vh; max-height: 50dvh; border-radius: 14px 14px 0 0;
  border-left: 0; border-right: 0; border-bottom: 0; padding-bottom: env(safe-area-inset-bottom); }
.narrow button { min-height: 44px; min-width: 44px; }
.narrow .toggle { min-height: 52px; }
summary { cursor: pointer; padding: 4px 0; }
.narrow summary { padding: 12px 0; }
.narrow.collapsed .t { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.narrow ul.feed { max-height: none; overflow: visible; }
@media (prefers-reduced-motion: reduce) { .chev { transition: none; } }
`

const SKIP_CSS = `
:host { all: initial; }
a { position: fixed; left: 8px; top: 8px; z-index: 2147483001; padding: 10px 14px; border-radius: 8px; background: #0969da; color: #fff;
  font: 600 14px/1.4 system-ui, sans-serif; text-decoration: none; transform: translateY(-200%); }
a:focus { transform: none; outline: 3px solid #1f2328; outline-offset: 2px; }
`

// parseShortcut reads "Alt+Shift+A" into a keydown matcher (null when off).
function parseShortcut(spec) {
  if (spec === false || spec === null) return null
  const parts = String(spec || DEFAULT_SHORTCUT).split('+').map((x) => x.trim().toLowerCase())
  const key = parts.pop()
  const mods = { alt: parts.includes('alt'), shift: parts.includes('shift'), ctrl: parts.includes('ctrl') || parts.includes('control'), meta: parts.includes('meta') || parts.includes('cmd') }
  const code = /^[a-z]$/.test(key) ? 'Key' + key.toUpperCase() : /^[0-9]$/.test(key) ? 'Digit' + key : null
  return (e) => e.altKey === mods.alt && e.shiftKey === mods.shift && e.ctrlKey === mods.ctrl && e.metaKey === mods.meta &&
    (code ? e.code === code : String(e.key).toLowerCase() === key)
}

function createPanel(agent, doc, win, uiOpts, view) {
  const w = doc.defaultView || win || null
  const el = (tag, props = {}, ...children) => {
    const n = doc.createElement(tag)
    for (const [k, v] of Object.entries(props)) {
      if (v === undefined || v === null || v === false) continue
      if (k === 'testid') n.setAttribute('data-testid', v)
      else if (k === 'onclick') n.addEventListener('click', v)
      else if (k === 'class') n.className = v
      else if (k === 'text') n.textContent = v
      else n.setAttribute(k, v === true ? '' : v)
    }
    for (const c of children) if (c !== null && c !== undefined && c !== false) n.append(c)
    return n
  }
  const shortcut = uiOpts.shortcut === undefined ? DEFAULT_SHORTCUT : uiOpts.shortcut
  const matches = parseShortcut(shortcut)

  // ── structure, built once ──
  const host = doc.createElement('div')
  host.setAttribute('data-lapd-panel', '')
  // 'auto' (the default) follows prefers-color-scheme; 'light' or 'dark' fixes it.
  if (uiOpts.theme === 'light' || uiOpts.theme === 'dark') host.setAttribute('data-theme', uiOpts.theme)
  if (!doc.getElementById || !doc.getElementById('lapd-panel')) host.id = 'lapd-panel' // the skip link's target
  const root = typeof host.attachShadow === 'function' ? host.attachShadow({ mode: 'open' }) : host
  const dot = el('span', { class: 'dot', 'aria-hidden': 'true' })
  const title = el('span', { class: 't', testid: 'status' })
  const badgeNum = el('span')
  const badge = el('span', { class: 'badge', testid: 'badge', hidden: true }, badgeNum, el('span', { class: 'sr', text: ' waiting for your approval' }))
  const toggle = el('button', { class: 'toggle', testid: 'toggle', type: 'button', 'aria-expanded': 'true', 'aria-controls': 'lapd-body' },
    dot, title, badge, el('span', { class: 'chev', 'aria-hidden': 'true', text: '▾' }))
  const top = el('div', { class: 'sec', testid: 'connect-section' })
  const approvals = el('div', { class: 'sec', testid: 'approvals' })
  const detailsBtn = el('button', { class: 'link', type: 'button', testid: 'feed-details', 'aria-pressed': 'false', text: 'Show details' })
  const feed = el('ul', { class: 'feed', testid: 'feed', 'aria-label': 'Activity, newest first' })
  const activity = el('div', { class: 'sec' }, el('div', { class: 'hrow' }, el('h3', { text: 'Activity' }), detailsBtn), feed)
  const foot = el('div', { class: 'sec' })
  const body = el('div', { class: 'b', id: 'lapd-body', testid: 'body' }, approvals, top, activity, foot)
  const announcer = el('div', { class: 'sr', testid: 'announcer', 'aria-live': 'polite', 'aria-atomic': 'false' })
  const panel = el('section', { class: 'p', 'aria-label': 'AI assistant (lapd)', testid: 'panel' }, toggle, body, announcer)
  root.append(el('style', { text: PANEL_CSS }), panel)
  ;(uiOpts.container || doc.body || doc.documentElement).append(host)

  // The skip link: the page's first Tab stop, shown only while focused.
  let skipHost = null
  if (uiOpts.skipLink !== false && !uiOpts.container && doc.body) {
    skipHost = doc.createElement('div')
    skipHost.setAttribute('data-lapd-skip', '')
    const sroot = typeof skipHost.attachShadow === 'function' ? skipHost.attachShadow({ mode: 'open' }) : skipHost
    const a = el('a', { href: '#lapd-panel', testid: 'skip', text: shortcut ? `Skip to the AI panel (${shortcut})` : 'Skip to the AI panel' })
    a.addEventListener('click', (e) => { e.preventDefault(); jump() })
    sroot.append(el('style', { text: SKIP_CSS }), el('nav', { 'aria-label': 'Skip link' }, a))
    doc.body.prepend(skipHost)
  }

  // ── layout: wide panel or narrow bottom sheet ──
  const mq = w && typeof w.matchMedia === 'function' ? w.matchMedia(NARROW) : null
  let narrow = !!(mq && mq.matches)
  let collapsed = uiOpts.collapsed ?? narrow
  const onMedia = () => {
    const was = narrow
    narrow = !!(mq && mq.matches)
    if (narrow !== was) collapsed = narrow
    render()
  }
  if (mq) { if (typeof mq.addEventListener === 'function') mq.addEventListener('change', onMedia); else if (mq.addListener) mq.addListener(onMedia) }
  // The host sits at the end of the page and is as tall as the panel (plus
  // its margin on a wide screen), so the page can scroll everything above
  // it: always on a narrow screen, on a wide one while an approval waits
  // (what it is about must not stay hidden under the card).
  let waiting = 0
  function reserve() {
    const need = !uiOpts.container && typeof panel.getBoundingClientRect === 'function' && (narrow || waiting > 0)
    const h = need ? Math.ceil(panel.getBoundingClientRect().height) + (narrow ? 0 : 16) : 0
    host.style.height = h ? `${h}px` : '0px'
    // The feed is a Tab stop (with a focus ring) exactly when it scrolls.
    const scrolls = feed.scrollHeight > feed.clientHeight + 1
    if (scrolls) feed.setAttribute('tabindex', '0')
    else if (root.activeElement !== feed) feed.removeAttribute('tabindex')
  }
  const ro = w && typeof w.ResizeObserver === 'function' ? new w.ResizeObserver(reserve) : null
  if (ro) ro.observe(panel)

  toggle.addEventListener('click', () => { collapsed = !collapsed; render() })
  let showDetails = false
  detailsBtn.addEventListener('click', () => { showDetails = !showDetails; sigFeed = ''; render() })

  // ── focus ──
  let returnTo = null // where focus was before a jump into the panel
  let wantFocus = null // a data-testid to move focus to once it appears (after Connect: Copy)
  function primary() {
    return root.querySelector('[data-testid^="approve-"]') || root.querySelector('[data-testid="connect"]') ||
      root.querySelector('[data-testid="copy"]') || toggle
  }
  function jump() {
    const a = doc.activeElement
    if (a && a !== host && a !== doc.body) returnTo = a
    collapsed = false
    render()
    const t = primary()
    t.focus()
    if (typeof t.scrollIntoView === 'function') t.scrollIntoView({ block: 'nearest' })
  }
  const onKey = (e) => {
    if (matches && matches(e)) { e.preventDefault(); jump() }
  }
  doc.addEventListener('keydown', onKey, true)
  panel.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape') return
    e.stopPropagation()
    if (narrow) collapsed = true
    render()
    const back = returnTo && returnTo.isConnected ? returnTo : null
    returnTo = null
    ;(back || toggle).focus()
  })

  // ── announcements (one stable live region) ──
  function announce(text) {
    if (!text) return
    announcer.append(el('p', { text }))
    while (announcer.childNodes.length > 3) announcer.firstChild.remove()
  }
  let lastStatus = agent.status
  const seenConfirms = new Set()

  // While approvals wait, their words follow the app's state: a task the
  // human adds meanwhile is counted in "Delete every task (5 tasks)" at
  // once, not at the next 15 s refresh: Approve runs against the state as it
  // is then.
  let unwatch = null
  function watchState(on) {
    if (on && !unwatch && view.onState) unwatch = view.onState(schedule)
    else if (!on && unwatch) { unwatch(); unwatch = null }
  }

  // ── rendering: each section is rebuilt only when what it shows changed ──
  let copied = false
  let copyFailed = false // the last Copy did not reach the clipboard: say so where the human looks
  let lineOpen = false // the folded connect line, once an AI is connected
  let sigTop = ''
  let sigCards = ''
  let sigFeed = ''
  let sigFoot = ''
  let frame = null
  function schedule() {
    if (frame !== null) return
    const run = () => { frame = null; render() }
    frame = w && typeof w.requestAnimationFrame === 'function' ? w.requestAnimationFrame(run) : setTimeout(run, 0)
  }

  function render() {
    if (frame !== null) { (w && typeof w.cancelAnimationFrame === 'function' ? w.cancelAnimationFrame : clearTimeout)(frame); frame = null }
    const active = root.activeElement
    const activeId = active && active.getAttribute ? active.getAttribute('data-testid') : null
    const s = agent.status
    const pend = agent.pendingConfirms()
    waiting = pend.length
    watchState(pend.length > 0)

    panel.classList.toggle('narrow', narrow)
    panel.classList.toggle('collapsed', collapsed)
    // For the host page's CSS: [data-lapd-panel][data-layout=wide][data-state=open]
    // is a 340px card at the bottom right, which a page can make room for.
    if (host.getAttribute('data-layout') !== (narrow ? 'narrow' : 'wide')) host.setAttribute('data-layout', narrow ? 'narrow' : 'wide')
    if (host.getAttribute('data-state') !== (collapsed ? 'collapsed' : 'open')) host.setAttribute('data-state', collapsed ? 'collapsed' : 'open')
    body.hidden = collapsed
    toggle.setAttribute('aria-expanded', String(!collapsed))
    dot.style.background = DOT[s] || '#6e7781'
    title.setAttribute('data-status', s)
    let t = s === 'error' && agent.error ? `${STATUS_TEXT.error} (${agent.error.code})` : STATUS_TEXT[s] || s
    if (collapsed && pend.length) t = `Approve? ${pend[0].summary || pend[0].intent}`
    // Folded (a phone's bar) while the line waits to be pasted: say there is
    // something to do in it (the page may have been reloaded since Connect).
    else if (collapsed && s === 'pending-claude' && agent.connectLine) t = `${STATUS_TEXT[s]} · copy the line`
    title.textContent = t
    badge.hidden = pend.length === 0
    badgeNum.textContent = String(pend.length)

    // connect state
    const line = agent.connectLine
    const key = JSON.stringify([s, agent.error, agent.message, line, copied, copyFailed])
    if (key !== sigTop) {
      sigTop = key
      const parts = []
      if (agent.error && s === 'error') {
        const words = ERROR_WORDS[agent.error.code] || 'Something went wrong.'
        parts.push(el('p', { class: 'err', testid: 'error', text: `${words}${agent.error.detail ? ` (${agent.error.code}: ${agent.error.detail})` : ''}` }))
      }
      if (agent.message && s !== 'active') parts.push(el('p', { class: 'muted', text: agent.message }))
      if (s === 'reconnecting') {
        parts.push(el('p', { testid: 'reconnecting', text: 'The connection to lapd dropped; this tab keeps trying by itself. The AI\'s requests wait until it is back, and your approvals are kept.' }),
          el('button', { type: 'button', testid: 'retry', onclick: () => agent.connect(), text: 'Try now' }))
      }
      if (s === 'idle' || s === 'error' || s === 'failed') {
        if (s === 'idle' && !agent.message) parts.push(el('p', { class: 'muted', text: 'Let an AI assistant (Claude, or any MCP client) use this app. You approve the risky steps here.' }))
        parts.push(el('button', { class: 'primary', type: 'button', testid: 'connect', onclick: () => { wantFocus = 'copy'; agent.connect() }, text: s === 'idle' ? 'Connect an AI' : 'Connect again' }))
      }
      if (line && s === 'pending-claude') {
        parts.push(el('p', { text: 'Paste this line into your AI chat:' }), lineRow(line),
          el('p', { class: 'muted small', text: 'It lets the AI use this app until you disconnect. Keep it private.' }))
      }
      top.replaceChildren(...parts)
    }

    // approvals
    const now = Date.now()
    const cardKey = JSON.stringify(pend.map((c) => [c.id, c.summary, c.reason, c.payload, c.expiresAt ? relativeUntil(c.expiresAt, now) : '']))
    if (cardKey !== sigCards) {
      sigCards = cardKey
      const parts = []
      if (pend.length) parts.push(el('h3', { text: pend.length === 1 ? 'Approval needed' : `Approvals needed (${pend.length})` }))
      for (const c of pend) {
        const tid = `ask-${c.id}`
        const fields = c.payload && typeof c.payload === 'object' ? Object.entries(c.payload).slice(0, 8) : []
        parts.push(el('div', { class: 'card', role: 'group', 'aria-labelledby': tid, testid: `card-${c.id}` },
          el('p', { class: 'ask', id: tid }, 'The AI asks to: ', el('strong', { text: c.summary || c.intent || c.variant })),
          c.reason ? el('p', { text: `Why: ${c.reason}` }) : null,
          fields.length ? el('dl', {}, ...fields.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: readable(v) })])) : null,
          c.expiresAt ? el('p', { class: 'muted small', text: `If you do not answer, it is rejected ${relativeUntil(c.expiresAt, now)}.` }) : null,
          el('div', { class: 'row' },
            // Each button names what it answers (two cards both have an Approve).
            el('button', { class: 'primary', type: 'button', testid: `approve-${c.id}`, 'aria-describedby': tid, onclick: () => agent.approve(c.id), text: 'Approve' }),
            el('button', { class: 'danger', type: 'button', testid: `reject-${c.id}`, 'aria-describedby': tid, onclick: () => agent.reject(c.id), text: 'Reject' }))))
      }
      approvals.replaceChildren(...parts)
    }
    for (const c of pend) {
      if (seenConfirms.has(c.id)) continue
      seenConfirms.add(c.id)
      announce(`Approval needed: ${c.summary || c.intent}.${matches ? ` Press ${shortcut} to answer.` : ''}`)
    }

    // activity
    const items = view.feed()
    const rows = items.map((it) => [it.id, it.tone, it.label, it.text, it.count || 0, relativeTime(it.at, now), showDetails ? it.detail : ''])
    const feedKey = JSON.stringify([rows, showDetails])
    if (feedKey !== sigFeed) {
      sigFeed = feedKey
      detailsBtn.setAttribute('aria-pressed', String(showDetails))
      detailsBtn.textContent = showDetails ? 'Hide details' : 'Show details'
      detailsBtn.hidden = !items.some((it) => it.detail)
      if (!items.length) {
        feed.replaceChildren(el('li', { class: 'read', text: 'Nothing yet. What the AI reads and does shows up here.' }))
      } else {
        feed.replaceChildren(...items.map((it) => el('li', { class: it.tone, 'data-id': it.id },
          it.label ? el('span', { class: 'lbl', text: `${it.label}: ` }) : null,
          el('span', { text: it.text }),
          it.count > 1 ? el('span', { class: 'muted', text: ` (${it.count} times)` }) : null,
          ' ',
          it.at ? el('time', { datetime: new Date(it.at).toISOString(), title: new Date(it.at).toLocaleString(), text: relativeTime(it.at, now) }) : null,
          showDetails && it.detail ? el('p', { class: 'det', text: it.detail }) : null)))
      }
    }

    // footer: Cancel before an AI connected; the connect line (folded) and
    // Disconnect after
    const footKey = JSON.stringify([s, !!agent.session, line, copied, copyFailed])
    if (footKey !== sigFoot) {
      sigFoot = footKey
      const parts = []
      if (line && (s === 'active' || s === 'reconnecting')) {
        const d = el('details', { open: lineOpen }, el('summary', { class: 'muted', testid: 'connect-line-toggle', text: 'Connect line' }), lineRow(line))
        d.addEventListener('toggle', () => { lineOpen = d.open })
        parts.push(d)
      }
      if (agent.session && s === 'pending-claude')
        parts.push(el('button', { type: 'button', testid: 'cancel', onclick: () => agent.disconnect(), text: 'Cancel' }))
      else if (agent.session && (s === 'active' || s === 'reconnecting' || s === 'failed'))
        parts.push(el('button', { class: 'danger', type: 'button', testid: 'disconnect', onclick: () => agent.disconnect(), text: 'Disconnect the AI' }))
      foot.replaceChildren(...parts)
    }

    // status changes are announced once
    if (s !== lastStatus) {
      lastStatus = s
      if (s !== 'minting') announce(s === 'error' && agent.error ? `${STATUS_TEXT.error}: ${ERROR_WORDS[agent.error.code] || agent.error.code}` : STATUS_TEXT[s])
    }

    // focus: stay on the control that was used; when it went away, go to the
    // next thing to do (the next approval, Connect, or the bar), never to the
    // page's body.
    if (active && !active.isConnected) {
      const same = activeId ? root.querySelector(`[data-testid="${CSS_ESCAPE(activeId)}"]`) : null
      const next = same || root.querySelector('[data-testid^="approve-"]') ||
        (/^(disconnect|cancel)$/.test(activeId || '') ? root.querySelector('[data-testid="connect"]') : null) || toggle
      next.focus({ preventScroll: true })
    }
    if (wantFocus) {
      const cur = root.activeElement
      const t = root.querySelector(`[data-testid="${wantFocus}"]`)
      if (cur && cur !== toggle) wantFocus = null // the human went on elsewhere in the panel
      else if (!cur && doc.activeElement && doc.activeElement !== doc.body && doc.activeElement !== host) wantFocus = null // … or in the page
      else if (t) { t.focus({ preventScroll: true }); wantFocus = null }
    }
    reserve()
  }

  // The connect line, one scrollable line, and its Copy button.
  function lineRow(line) {
    const input = el('input', { class: 'cl', testid: 'connect-line', readonly: true, value: line, 'aria-label': 'Connect line', spellcheck: 'false', autocomplete: 'off' })
    input.value = line
    input.addEventListener('focus', () => input.select())
    const copy = el('button', { type: 'button', testid: 'copy', text: copied ? 'Copied' : 'Copy', 'aria-label': copied ? 'Copied the connect line' : 'Copy the connect line' })
    copy.addEventListener('click', async () => {
      let ok = false
      try { await w.navigator.clipboard.writeText(line); ok = true } catch {
        try { input.select(); ok = doc.execCommand('copy') } catch { ok = false }
      }
      copied = ok
      copyFailed = !ok
      announce(ok ? 'Copied. Paste it into your AI chat.' : `Could not copy. ${COPY_BY_HAND}`)
      render()
      if (!ok) { // the line, rebuilt, is selected and focused: the keyboard's copy takes it
        const again = root.querySelector('[data-testid="connect-line"]')
        if (again) again.focus({ preventScroll: true })
      }
    })
    const row = el('div', { class: 'line' }, input, copy)
    if (!copyFailed) return row
    return el('div', { class: 'sec' }, row, el('p', { class: 'err small', testid: 'copy-failed', text: `This browser did not let the panel copy. ${COPY_BY_HAND}` }))
  }

  // The human is in another tab (the AI's chat) when an approval comes:
  // the panel cannot be seen, and a hidden page does not even render it.
  // While the page is hidden and approvals wait, the title — what the tab
  // strip shows — starts with how many; shown again, or answered, it is
  // the app's again (a title the app set meanwhile is kept).
  let appTitle = null
  let ourTitle = null
  function titleBadge() {
    if (uiOpts.titleBadge === false || typeof doc.title !== 'string') return
    if (ourTitle !== null && doc.title !== ourTitle) { appTitle = doc.title; ourTitle = null } // the app retitled itself
    const n = agent.pendingConfirms().length
    if (n > 0 && doc.visibilityState === 'hidden') {
      if (ourTitle === null) appTitle = doc.title
      ourTitle = `(${n}) ${n === 1 ? 'Approval' : 'Approvals'} needed · ${appTitle}`
      if (doc.title !== ourTitle) doc.title = ourTitle
    } else if (ourTitle !== null) {
      doc.title = appTitle
      ourTitle = appTitle = null
    }
  }
  const onPageVisibility = () => titleBadge()
  doc.addEventListener('visibilitychange', onPageVisibility)

  const offs = [
    agent.on('status', () => { copied = copyFailed = false; schedule() }),
    agent.on('confirm', () => { schedule(); titleBadge() }),
    agent.on('log', (entry) => {
      const it = view.describe ? view.describe(entry) : null
      if (it && it.tone !== 'read' && it.tone !== 'wait') announce(`${it.label ? `${it.label}: ` : ''}${it.text}`)
    }),
  ]
  const ticker = setInterval(schedule, 15000) // relative times
  if (ticker && typeof ticker.unref === 'function') ticker.unref()
  render()
  return {
    render,
    schedule,
    jump,
    remove() {
      offs.forEach((f) => f())
      watchState(false)
      doc.removeEventListener('visibilitychange', onPageVisibility)
      if (ourTitle !== null && doc.title === ourTitle) doc.title = appTitle
      clearInterval(ticker)
      if (frame !== null) { (w && typeof w.cancelAnimationFrame === 'function' ? w.cancelAnimationFrame : clearTimeout)(frame); frame = null }
      doc.removeEventListener('keydown', onKey, true)
      if (mq) { if (typeof mq.removeEventListener === 'function') mq.removeEventListener('change', onMedia); else if (mq.removeListener) mq.removeListener(onMedia) }
      if (ro) ro.disconnect()
      host.remove()
      if (skipHost) skipHost.remove()
    },
  }
}

// readable writes a payload value for a person: strings as they are, the rest as short JSON.
function CSS_ESCAPE(s) { return String(s).replace(/["\\]/g, '\\$&') }

function readable(v) {
  if (typeof v === 'string') return clip(v, 200)
  try { return clip(JSON.stringify(v), 200) } catch { return String(v) }
}

// "in 9 min" / "in 40 s" / "now".
function relativeUntil(at, now) {
  const s = Math.round((at - now) / 1000)
  if (s <= 5) return 'now'
  if (s < 60) return `in ${s} s`
  const m = Math.round(s / 60)
  return m < 60 ? `in ${m} min` : `in ${Math.round(m / 60)} h`
}
