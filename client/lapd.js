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
//       clearAll: { intent: 'Delete every task', requiresConfirm: true, handler: () => store.clear() },
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
//   3. Shows the panel (Shadow DOM, bottom-right): connect line, status,
//      pending approvals, activity feed. ui:false hides it; every piece is also
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
  statsSamples: 1000, // rpc timings kept for stats().rpcHandleMsP50
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
 * refused{code,detail}, revoked, close-final{code,detail}, disconnect.
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
    default:
      return st
  }
}

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
 * [{path, message}] with JSON Pointer paths (at most LIMITS.validationErrors).
 * Unknown keywords are ignored (the server checks the full schema).
 */
export function validatePayload(schema, value, path = '', errors = [], depth = 0) {
  if (errors.length >= LIMITS.validationErrors || schema == null || schema === true) return errors
  const add = (message) => { if (errors.length < LIMITS.validationErrors) errors.push({ path, message }) }
  if (schema === false) { add('no value is allowed here'); return errors }
  if (typeof schema !== 'object' || depth > LIMITS.schemaDepth) return errors
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type]
    if (!types.some((t) => typeMatches(t, value))) {
      add(`expected ${types.join(' or ')}, got ${value === null ? 'null' : Array.isArray(value) ? 'array' : typeof value}`)
      return errors
    }
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => jsonEqual(e, value)))
    add(`must be one of ${schema.enum.map((e) => JSON.stringify(e)).join(', ')}`)
  if ('const' in schema && !jsonEqual(schema.const, value)) add(`must be ${JSON.stringify(schema.const)}`)
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
            errors.push({ path: `${path}/${escapePointerSegment(k)}`, message: 'is required' })
        }
      }
    }
    for (const k of Object.keys(value)) {
      const p = `${path}/${escapePointerSegment(k)}`
      if (own(props, k)) validatePayload(props[k], value[k], p, errors, depth + 1)
      else if (schema.additionalProperties === false) {
        if (errors.length < LIMITS.validationErrors) errors.push({ path: p, message: 'is not allowed' })
      } else if (schema.additionalProperties && typeof schema.additionalProperties === 'object')
        validatePayload(schema.additionalProperties, value[k], p, errors, depth + 1)
    }
  }
  return errors
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
function isHidden(el) {
  if (el.hidden === true || attr(el, 'hidden') !== null || attr(el, 'aria-hidden') === 'true') return true
  if (attr(el, 'data-lapd-panel') !== null) return true
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
    if (attr(c, 'data-lapd-panel') !== null) continue
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
      if (attr(c, 'data-lapd-panel') !== null) return
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
  let heartbeatTimer = null
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

  // Change source: the app's subscribe(), else polling while someone listens.
  const changeListeners = new Set()
  let unsubscribeApp = null
  let pollTimer = null
  let lastPolled
  function startChanges() {
    if (unsubscribeApp || pollTimer) return
    if (typeof opts.subscribe === 'function') {
      unsubscribeApp = opts.subscribe(() => { for (const fn of [...changeListeners]) fn() }) || (() => {})
    } else {
      let ref = opts.getState()
      lastPolled = JSON.stringify(toWire(ref))
      pollTimer = setInterval(() => {
        const cur = opts.getState()
        if (cur === ref) { const s = JSON.stringify(toWire(cur)); if (s === lastPolled) return; lastPolled = s }
        else { ref = cur; const s = JSON.stringify(toWire(cur)); if (s === lastPolled) return; lastPolled = s }
        for (const fn of [...changeListeners]) fn()
      }, opts.pollMs ?? 50)
    }
  }
  function stopChangesIfIdle() {
    if (changeListeners.size) return
    if (pollTimer) { clearInterval(pollTimer); pollTimer = null }
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
  function addLog(entry) {
    logRing.push(entry)
    if (logRing.length > LIMITS.logEntries) logRing.shift()
    emit('log', entry)
    if (ui) ui.render()
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
    if (ui) ui.render()
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
        reconnectTimer = setTimeout(() => { reconnectTimer = null; fire({ type: 'reconnect-attempt', elapsedMs: delay }) }, delay)
        break
      }
    }
  }

  async function mint() {
    try {
      const res = await fetchFn(`${base}${basePath}/mint`, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: '{}' })
      const body = await res.json().catch(() => null)
      if (!res.ok || !body || typeof body.token !== 'string') {
        fire({ type: 'mint-failed', code: `http-${res.status}`, detail: (body && body.error && (body.error.detail || body.error.code)) || res.statusText || '' })
        return
      }
      session = { token: body.token, tid: body.tid, lapUrl: body.lapUrl, wsUrl: body.wsUrl, expiresAt: body.expiresAt }
      fire({ type: 'mint-ok' })
    } catch (e) {
      fire({ type: 'mint-failed', code: 'network', detail: errMessage(e) })
    }
  }

  async function revokeRemote() {
    const s = session
    if (!s || !fetchFn) return
    try {
      await fetchFn(`${base}${basePath}/revoke`, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ tid: s.tid }) })
    } catch (e) { emit('error', e) }
  }

  function openSocket() {
    closeSocket(1000)
    if (!session || !WS || destroyed) return
    const url = session.wsUrl + (session.wsUrl.includes('?') ? '&' : '?') + 'token=' + encodeURIComponent(session.token)
    let sock
    try { sock = new WS(url) } catch (e) { emit('error', e); fire({ type: 'ws-closed', hasToken: true }); return }
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

  function startHeartbeat(ms) {
    stopHeartbeat()
    if (!(ms > 0)) return
    missedPongs = 0
    heartbeatTimer = setInterval(() => {
      if (missedPongs >= LIMITS.missedPongs) {
        // Dead socket: drop it without waiting for TCP and reconnect.
        const sock = ws
        closeSocket(4000)
        if (sock) fire({ type: 'ws-closed', hasToken: !!session })
        return
      }
      missedPongs++
      send({ t: 'ping' })
    }, Math.max(1000, ms))
  }
  function stopHeartbeat() { if (heartbeatTimer) { clearInterval(heartbeatTimer); heartbeatTimer = null } }

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

  // ── frames from the server ──
  function onFrame(data) {
    const t0 = clock()
    let f
    try { f = JSON.parse(data) } catch { return }
    if (!f || typeof f.t !== 'string') return
    switch (f.t) {
      case 'rpc': handleRpc(f, t0); break
      case 'hello-ack': startHeartbeat(f.heartbeatMs); break
      case 'pong': missedPongs = 0; break
      case 'active': fire({ type: 'activated' }); emit('active'); break
      case 'revoked': fire({ type: 'revoked' }); emit('revoked'); break
      case 'log-push': if (f.entry && typeof f.entry === 'object') { addLog(f.entry); send({ t: 'log-append', entry: f.entry }) } break
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
    let entry = { id, at: now(), kind: 'read', intent: READ_INTENTS[f.tool] || f.tool }
    try {
      const r = await tool(args, meta)
      result = r.result
      if (r.log) entry = { ...entry, ...r.log }
      send({ t: 'rpc-reply', id, result })
    } catch (e) {
      const code = e && e.code ? e.code : 'internal'
      send({ t: 'rpc-error', id, code, detail: errMessage(e) })
      entry = { ...entry, kind: 'error', detail: errMessage(e) }
    }
    send({ t: 'log-append', entry })
    addLog(entry)
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
        if (gate.errors) return { result: { status: 'rejected', reason: 'schema-mismatch', errors: gate.errors }, log }
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
          let timer
          const woke = await new Promise((res) => { wake = () => res(true); timer = setTimeout(() => { wake = null; res(false) }, windowMs) })
          clearTimeout(timer)
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
    const gate = gateMessage(actions, msg)
    if (gate) {
      lastSend = { status: 'rejected', variant, detail: gate.detail }
      return { result: gate, log: { ...base, kind: 'blocked', detail: `${gate.reason}: ${gate.detail}` } }
    }
    if (a && a.requiresConfirm) {
      if (pendingConfirms().length >= LIMITS.pendingConfirms)
        return { result: { status: 'rejected', reason: 'invalid', detail: 'too many approvals are waiting; ask the user to answer them first' }, log: { ...base, kind: 'blocked' } }
      const entry = {
        id: uuid(), variant, payload: toWire(payloadOf(msg)), intent: a.intent || variant,
        reason: typeof args.reason === 'string' ? args.reason.slice(0, 500) : null, proposedAt: now(), status: 'pending',
      }
      confirms.set(entry.id, entry)
      emit('confirm', pendingConfirms(), entry)
      lastSend = { status: 'pending-confirmation', variant }
      return { result: { status: 'pending-confirmation', confirmId: entry.id }, log: { ...base, kind: 'proposed' } }
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
    return { result, log: { ...base, kind: 'dispatched', stateDiff } }
  }

  function clampNum(v, dflt, min, max) {
    return typeof v === 'number' && Number.isFinite(v) ? Math.min(Math.max(v, min), max) : dflt
  }

  // ── confirms ──
  function pendingConfirms() { return [...confirms.values()].filter((c) => c.status === 'pending') }

  // Every approval is gated again right before it runs, whatever frame
  // brought it (our own proposal, or a confirm-sync after a reload): an
  // unknown or human-only variant, or a payload that fails its schema, is
  // never dispatched; it is answered as rejected instead.
  function approvalMsg(c) { return { ...fromWire(c.payload && typeof c.payload === 'object' ? c.payload : {}), type: c.variant } }
  function refuseApproval(c, gate) {
    confirms.delete(c.id)
    sendOrQueue({ t: 'confirm-resolved', confirmId: c.id, outcome: 'user-cancelled' })
    addLog({ id: `confirm-${c.id}`, at: now(), kind: 'blocked', variant: c.variant, intent: c.intent, detail: `approval refused: ${gate.reason}: ${gate.detail}` })
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
    const drain = await runDispatch(msg, { waitFor: 'drained', drainQuietMs: 100, timeoutMs: 2000 })
    confirms.delete(confirmId)
    const stateAfter = wireState()
    sendOrQueue({ t: 'confirm-resolved', confirmId, outcome: 'confirmed', stateAfter })
    addLog({ id: `confirm-${confirmId}`, at: now(), kind: 'confirmed', variant: c.variant, intent: c.intent, detail: drain.errors.length ? `errors: ${drain.errors.map((e) => e.message).join('; ')}` : 'approved by the user' })
    return true
  }

  function reject(confirmId) {
    const c = confirms.get(confirmId)
    if (!c || c.status !== 'pending') return false
    confirms.delete(confirmId)
    sendOrQueue({ t: 'confirm-resolved', confirmId, outcome: 'user-cancelled' })
    addLog({ id: `confirm-${confirmId}`, at: now(), kind: 'rejected', variant: c.variant, intent: c.intent, detail: 'rejected by the user' })
    emit('confirm', pendingConfirms(), { ...c, status: 'rejected' })
    return true
  }

  function expireConfirm(confirmId, reason) {
    const c = confirms.get(confirmId)
    if (!c || c.status !== 'pending') return
    confirms.delete(confirmId)
    addLog({ id: `confirm-${confirmId}`, at: now(), kind: 'rejected', variant: c.variant, intent: c.intent, detail: `expired${reason ? ` (${reason})` : ''}` })
    emit('confirm', pendingConfirms(), { ...c, status: 'rejected', reason: reason || 'expired' })
  }

  function syncConfirms(pending) {
    if (!Array.isArray(pending)) return
    let changed = false
    for (const p of pending.slice(0, LIMITS.pendingConfirms)) {
      if (!p || typeof p.confirmId !== 'string' || confirms.has(p.confirmId)) continue
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
    if (changed) { emit('confirm', pendingConfirms()); if (ui) ui.render() }
  }

  // ── visibility ──
  const onVisibility = () => send({ t: 'visibility', visible: isVisible() })
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
        const res = await fetchFn(`${base}${basePath}/resume/claim`, { method: 'POST', credentials: 'include', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ tid }) })
        const body = await res.json().catch(() => null)
        if (!res.ok || !body || typeof body.token !== 'string') {
          const code = (body && body.error && body.error.code) || `http-${res.status}`
          emit('error', Object.assign(new Error(`resume failed: ${code}`), { code }))
          return false
        }
        clearTimeout(reconnectTimer)
        session = { token: body.token, tid: body.tid, lapUrl: body.lapUrl, wsUrl: body.wsUrl, expiresAt: body.expiresAt }
        fire({ type: 'resume-ok' })
        return true
      } catch (e) { emit('error', e); return false }
    },
    on,
    approve,
    reject,
    pendingConfirms: () => pendingConfirms().map((c) => ({ ...c })),
    log: () => logRing.slice(),
    stats,
    destroy() {
      destroyed = true
      clearTimeout(reconnectTimer)
      closeSocket(1000)
      watches.clear()
      changeListeners.clear()
      stopChangesIfIdle()
      if (doc && typeof doc.removeEventListener === 'function') doc.removeEventListener('visibilitychange', onVisibility)
      if (ui) ui.remove()
      ui = null
      listeners.clear()
    },
  }

  if (opts.ui !== false && doc && typeof doc.createElement === 'function') ui = createPanel(agent, doc, opts.ui && typeof opts.ui === 'object' ? opts.ui.container : null)
  // Restore a session kept across a reload (no new mint).
  if (opts.autoRestore !== false && session) queueMicrotask(() => { if (!destroyed && conn.status === 'idle' && session) fire({ type: 'restore' }) })
  return agent
}

// ───────────────────────────── panel (Shadow DOM) ─────────────────────────────

const STATUS_TEXT = {
  idle: 'Not connected', minting: 'Creating a session…', 'pending-claude': 'Waiting for the AI: paste the line below into your chat',
  active: 'AI connected', reconnecting: 'Reconnecting…', failed: 'Connection lost', error: 'Error',
}
const DOT = { idle: '#9aa0a6', minting: '#f5a623', 'pending-claude': '#f5a623', active: '#1e9e5a', reconnecting: '#f5a623', failed: '#d93025', error: '#d93025' }

const PANEL_CSS = `
:host { all: initial; }
.p { position: fixed; right: 16px; bottom: 16px; z-index: 2147483000; width: 320px; max-height: 70vh; display: flex; flex-direction: column;
  font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; background: #fff; border: 1px solid #d0d7de;
  border-radius: 10px; box-shadow: 0 8px 24px rgba(0,0,0,.15); overflow: hidden; }
.h { display: flex; align-items: center; gap: 8px; padding: 8px 10px; background: #f6f8fa; border-bottom: 1px solid #d0d7de; }
.dot { width: 10px; height: 10px; border-radius: 50%; flex: none; }
.t { font-weight: 600; flex: 1; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.b { padding: 10px; overflow: auto; display: flex; flex-direction: column; gap: 8px; }
.b > * { flex-shrink: 0; }
.collapsed .b { display: none; }
button { font: inherit; border: 1px solid #d0d7de; background: #f6f8fa; color: inherit; border-radius: 6px; padding: 4px 10px; cursor: pointer; }
button:hover { background: #eef1f4; }
button:focus-visible { outline: 2px solid #0969da; outline-offset: 2px; }
button.primary { background: #0969da; border-color: #0969da; color: #fff; }
button.danger { color: #d1242f; }
.line { display: flex; gap: 6px; align-items: flex-start; }
code { flex: 1; font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: 6px; word-break: break-all; user-select: all; }
.err { color: #d1242f; }
.muted { color: #59636e; }
.card { border: 1px solid #f5a623; background: #fff8e6; border-radius: 8px; padding: 8px; display: flex; flex-direction: column; gap: 6px; }
pre { margin: 0; font: 12px/1.4 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; max-height: 120px; overflow: auto; }
.row { display: flex; gap: 6px; }
ul { list-style: none; margin: 0; padding: 0; display: flex; flex-direction: column; gap: 4px; max-height: 200px; overflow: auto; }
li { padding: 4px 6px; border-radius: 6px; background: #f6f8fa; }
li.blocked, li.error, li.rejected { background: #ffebe9; }
li.dispatched, li.confirmed { background: #dafbe1; }
li.narrate { background: #ddf4ff; }
summary { cursor: pointer; }
details[open] summary { margin-bottom: 6px; }
h3 { margin: 0; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; color: #59636e; }
`

function createPanel(agent, doc, container) {
  const host = doc.createElement('div')
  host.setAttribute('data-lapd-panel', '')
  const root = typeof host.attachShadow === 'function' ? host.attachShadow({ mode: 'open' }) : host
  const el = (tag, props = {}, ...children) => {
    const n = doc.createElement(tag)
    for (const [k, v] of Object.entries(props)) {
      if (k === 'testid') n.setAttribute('data-testid', v)
      else if (k === 'onclick') n.addEventListener('click', v)
      else if (k === 'class') n.className = v
      else if (k === 'text') n.textContent = v
      else n.setAttribute(k, v)
    }
    for (const c of children) if (c) n.append(c)
    return n
  }
  const style = el('style', { text: PANEL_CSS })
  const dot = el('span', { class: 'dot', 'aria-hidden': 'true' })
  const title = el('span', { class: 't', testid: 'status', role: 'status', 'aria-live': 'polite' })
  const toggle = el('button', { 'aria-expanded': 'true', 'aria-label': 'Collapse the lapd panel', text: '–' })
  const body = el('div', { class: 'b' })
  const panel = el('section', { class: 'p', 'aria-label': 'AI connection (lapd)' }, el('div', { class: 'h' }, dot, title, toggle), body)
  toggle.addEventListener('click', () => {
    const collapsed = panel.classList.toggle('collapsed')
    toggle.textContent = collapsed ? '+' : '–'
    toggle.setAttribute('aria-expanded', String(!collapsed))
    toggle.setAttribute('aria-label', collapsed ? 'Expand the lapd panel' : 'Collapse the lapd panel')
  })
  root.append(style, panel)
  ;(container || doc.body || doc.documentElement).append(host)

  let copied = false
  function render() {
    const s = agent.status
    dot.style.background = DOT[s] || '#9aa0a6'
    title.textContent = s === 'error' && agent.error ? `Error: ${agent.error.code}` : STATUS_TEXT[s] || s
    title.setAttribute('data-status', s)
    const parts = []
    if (agent.error && s === 'error') parts.push(el('div', { class: 'err', text: agent.error.detail || agent.error.code }))
    if (agent.message && s !== 'active') parts.push(el('div', { class: 'muted', text: agent.message }))
    if (s === 'idle' || s === 'error' || s === 'failed') {
      parts.push(el('button', { class: 'primary', testid: 'connect', onclick: () => agent.connect(), text: s === 'idle' ? 'Connect an AI' : 'Connect again' }))
    }
    const line = agent.connectLine
    if (line && (s === 'pending-claude' || s === 'active' || s === 'reconnecting')) {
      const copy = el('button', { testid: 'copy', 'aria-label': 'Copy the connect line', text: copied ? 'Copied' : 'Copy' })
      copy.addEventListener('click', async () => {
        try { await doc.defaultView.navigator.clipboard.writeText(line); copied = true } catch { copied = false }
        render()
      })
      const row = el('div', { class: 'line' }, el('code', { testid: 'connect-line', text: line }), copy)
      if (s === 'pending-claude') parts.push(el('div', { class: 'muted', text: 'Paste this into your AI chat:' }), row)
      else parts.push(el('details', {}, el('summary', { class: 'muted', text: 'Connect line' }), row))
    }
    const pend = agent.pendingConfirms()
    if (pend.length) {
      parts.push(el('h3', { text: `Approval needed (${pend.length})` }))
      for (const c of pend) {
        parts.push(el('div', { class: 'card', role: 'group', 'aria-label': `Approve ${c.intent}?` },
          el('strong', { text: c.intent || c.variant }),
          c.reason ? el('div', { text: `Reason: ${c.reason}` }) : null,
          c.payload && Object.keys(c.payload).length ? el('pre', { text: JSON.stringify(c.payload, null, 2) }) : null,
          el('div', { class: 'row' },
            el('button', { class: 'primary', testid: `approve-${c.id}`, onclick: () => agent.approve(c.id), text: 'Approve' }),
            el('button', { class: 'danger', testid: `reject-${c.id}`, onclick: () => agent.reject(c.id), text: 'Reject' }))))
      }
    }
    const entries = agent.log().slice(-30).reverse()
    parts.push(el('h3', { text: 'Activity' }))
    const feed = el('ul', { testid: 'feed', 'aria-live': 'polite' })
    if (!entries.length) feed.append(el('li', { class: 'muted', text: 'Nothing yet.' }))
    for (const e of entries) {
      let text = e.intent || e.variant || e.kind
      if (e.kind === 'narrate') text = e.detail || text
      else if (e.kind === 'dispatched') text = `${text}: ${summarizeDiff(e.stateDiff)}`
      else if (e.kind === 'blocked' || e.kind === 'error' || e.kind === 'rejected') text = `${text}: ${e.detail || e.kind}`
      else if (e.kind === 'proposed') text = `${text}: waiting for your approval`
      feed.append(el('li', { class: e.kind, text }))
    }
    parts.push(feed)
    if (agent.session && s !== 'idle' && s !== 'minting') parts.push(el('button', { class: 'danger', testid: 'disconnect', onclick: () => agent.disconnect(), text: 'Disconnect' }))
    const focusedId = root.activeElement && root.activeElement.getAttribute && root.activeElement.getAttribute('data-testid')
    body.replaceChildren(...parts)
    if (focusedId) { const f = body.querySelector(`[data-testid="${focusedId}"]`); if (f) f.focus() }
  }
  const offs = [agent.on('status', () => { copied = false; render() }), agent.on('confirm', render)]
  render()
  return { render, remove() { offs.forEach((f) => f()); host.remove() } }
}
