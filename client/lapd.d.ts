// Type declarations for lapd.js (hand-written; the module itself has no build step).
// Served by lapd at /agent/client.d.ts next to /agent/client.js.

/** A JSON Schema (the client checks a subset; the lapd server checks all of it). */
export type JSONSchema = boolean | { [keyword: string]: unknown }

/** A message: the action name in `type`, the payload in the other fields. */
export interface Msg { type: string; [field: string]: unknown }

export interface HandlerContext<S = unknown> {
  /** The app state when the handler was called. */
  state: S
  /** Dispatch another msg through the same path (handler, else dispatch()). */
  dispatch(msg: Msg): unknown
  /** Always 'agent': handlers are called by the runtime for the LLM. */
  source: 'agent'
  msg: Msg
}

export interface ActionSpec<S = unknown, P = any> {
  /** One line for the LLM: what the action does. */
  intent?: string
  /** JSON Schema for the payload (the msg without `type`). */
  schema?: JSONSchema
  /** Runs the action. A returned Promise counts as an effect when waiting for "drained". */
  handler?(payload: P, ctx: HandlerContext<S>): unknown
  /** The LLM proposes; the user approves in the panel before it runs. */
  requiresConfirm?: boolean
  /** Never listed for, nor dispatchable by, the LLM. */
  humanOnly?: boolean
  /** Only the LLM uses it (dispatchMode 'agent-only'). */
  agentOnly?: boolean
  /** Listed with source 'always-affordable' even when no button for it is on screen. */
  alwaysAffordable?: boolean
  /** Whole example msgs, e.g. [{type:'addTask', title:'Buy milk'}]. */
  examples?: Msg[]
  warning?: string
  /** Names of the msgs this action may dispatch in turn. */
  emits?: string[]
  /** true when the action can run now, else a reason shown to the LLM (listed as unavailable). */
  available?(state: S): true | string
  /**
   * The action in the human's words, for the panel: its approval card ("The AI
   * asks to: Delete every task (6 tasks)") and its activity feed ("Done: Add
   * "Buy milk" to todo"). msg is the whole msg (type and payload); state is the
   * state it runs against (for an approval, the current one). Without it the
   * panel shows the intent and the payload's first plain values. Cut to 200
   * characters; a throw or a blank string falls back to the intent.
   */
  summarize?(msg: Msg & P, state: S): string
}

export interface AgentContext { summary: string; hints?: string[]; cautions?: string[]; [k: string]: unknown }

export interface AgentOptions<S = unknown> {
  app: { name: string; version: string }
  /** The current app state (plain data; Dates are tagged on the wire). */
  getState(): S
  /** Reducer-style dispatch; used for msgs whose action has no handler (or when no actions are declared). */
  dispatch?(msg: Msg): unknown
  /** The actions the LLM may use. When given, any other variant is rejected. */
  actions?: Record<string, ActionSpec<S>>
  /** Called on every state commit; returns an unsubscribe. Without it the runtime polls while it needs changes. */
  subscribe?(listener: () => void): () => void
  /** Free-form docs for /describe. */
  docs?: unknown
  /** JSON Schema of the state, for /describe. */
  stateSchema?: JSONSchema | null
  context?(state: S): AgentContext
  /** Action names (or msgs) currently on screen: listed with source 'binding'. */
  affordances?(state: S): Array<string | Msg>
  /** Applied to every state that leaves the tab. */
  redact?(state: S): unknown
  /** A pure reducer; enables would_dispatch predictions. */
  reducer?(state: S, msg: Msg): S
  /** Origin of the lapd server (default: the page's origin). */
  baseUrl?: string
  /** Prefix of the meta routes (default '/agent'). */
  agentBasePath?: string
  /** true (default): show the panel; false: no panel; an object: show it with these options. */
  ui?: boolean | PanelOptions
  /** Where the session is kept (default sessionStorage; null: nowhere). */
  storage?: Pick<Storage, 'getItem' | 'setItem' | 'removeItem'> | null
  /** Restore a stored session on load without a new mint (default true). */
  autoRestore?: boolean
  /** The subtree read by query_dom and describe_visible_content (default document.body). */
  root?: Element
  /** Polling interval when no subscribe is given (default 50 ms, only while needed). */
  pollMs?: number
  /** For tests and non-browser hosts. */
  fetch?: typeof fetch
  WebSocket?: { new (url: string): WebSocket }
  document?: Document
  window?: Pick<Window, 'addEventListener' | 'removeEventListener'>
}

export interface PanelOptions {
  /** Mount the panel in this element instead of the end of <body> (no skip link, no reserved room). */
  container?: Element
  /** The key that moves focus to the panel's next action (Approve, Connect, Copy); default 'Alt+Shift+A'; false: none. */
  shortcut?: string | false
  /** A "Skip to the AI panel" link as the page's first Tab stop, shown only while focused; default true. */
  skipLink?: boolean
  /** Start collapsed to one line; default: collapsed on narrow screens (≤ 640 px), open on wide ones. */
  collapsed?: boolean
  /** While the page is hidden and approvals wait, start document.title (what the tab strip shows) with "(n) Approval needed · "; default true. */
  titleBadge?: boolean
  /** Colours: 'auto' (default) follows the system's prefers-color-scheme; 'light' or 'dark' fixes them (for an app with one theme). */
  theme?: 'auto' | 'light' | 'dark'
}

export type Status = 'idle' | 'minting' | 'pending-claude' | 'active' | 'reconnecting' | 'failed' | 'error'

export interface AgentError { code: string; detail: string }

export interface ConfirmEntry {
  id: string
  variant: string
  payload: Record<string, unknown>
  intent: string
  reason: string | null
  proposedAt: number
  expiresAt?: number
  status: 'pending' | 'approved' | 'rejected'
  /** What it would do in the human's words (the action's summarize, against the current state). */
  summary?: string
}

export type DiffOp =
  | { op: 'add'; path: string; value: unknown }
  | { op: 'remove'; path: string }
  | { op: 'replace'; path: string; value: unknown }

export interface LogEntry {
  id: string
  at: number
  kind: 'proposed' | 'dispatched' | 'confirmed' | 'rejected' | 'blocked' | 'read' | 'error' | 'narrate'
  variant?: string
  intent?: string
  detail?: string
  stateDiff?: DiffOp[]
  /** On a 'proposed' entry and on the outcome of that approval. */
  confirmId?: string
  /** 'server' on an entry lapd recorded itself (a dispatch its policy refused, shown through a log-show frame). */
  source?: string
}

export interface AgentEvents {
  status: (status: Status, info: { error: AgentError | null; message: string | null }) => void
  confirm: (pending: ConfirmEntry[], changed?: ConfirmEntry & { reason?: string }) => void
  log: (entry: LogEntry) => void
  /** A model is using the session: its first call, or a re-pair of a session a model has used
   * (not a re-pair before any model call: the human still has to paste the line). */
  active: () => void
  revoked: () => void
  error: (err: Error & { code?: string }) => void
}

export interface Agent {
  readonly status: Status
  readonly error: AgentError | null
  readonly message: string | null
  readonly session: { tid: string; lapUrl: string; expiresAt: number } | null
  /** `Connect to my app with lapd: connect_session url=<lapUrl> token=<token>` or null. */
  readonly connectLine: string | null
  /** Restore the stored session, else mint a new one. No-op while connected. */
  connect(): void
  /** Revoke the session on the server, forget it, close the socket. */
  disconnect(): void
  /** Claim a pending-resume session (rotates its token). */
  resume(tid: string): Promise<boolean>
  listResumable(tids: string[]): Promise<Array<{ tid: string; label: string; status: string; createdAt: number; lastSeenAt: number }>>
  on<E extends keyof AgentEvents>(event: E, fn: AgentEvents[E]): () => void
  /** Run the proposed msg and tell the server; queued if the socket is down. */
  approve(confirmId: string): Promise<boolean>
  reject(confirmId: string): boolean
  pendingConfirms(): ConfirmEntry[]
  log(): LogEntry[]
  /**
   * The client's own cost of answering rpc frames, measured with performance.now()
   * (browsers coarsen it, e.g. to 0.1 ms): wall time from a frame's arrival (before
   * JSON.parse) until its reply and log-append are sent, minus the app's handler and
   * the drain wait of send_message. Counts every rpc frame, also errors.
   */
  stats(): AgentStats
  /** Close the socket, remove the panel and listeners; the stored session is kept. */
  destroy(): void
}

export interface AgentStats {
  /** rpc frames handled since createAgent. */
  rpcCount: number
  /** Sum of their cost in ms. */
  rpcHandleMsTotal: number
  /** Lower median cost in ms over the last LIMITS.statsSamples (1000) rpcs; 0 before any. */
  rpcHandleMsP50: number
}

export function createAgent<S = unknown>(opts: AgentOptions<S>): Agent

// Pure helpers (exported for tests and for apps that want them).
export const LAP_VERSION: 2
export const STATUSES: readonly Status[]
export const LIMITS: Readonly<Record<string, number>>
export interface ConnState { status: Status; attempt: number; elapsedMs: number; error: AgentError | null; message: string | null }
export type ConnEvent =
  | { type: 'mint' | 'mint-ok' | 'restore' | 'resume-ok' | 'ws-opened' | 'activated' | 'revoked' | 'disconnect' }
  | { type: 'mint-failed' | 'refused' | 'close-final'; code?: string; detail?: string }
  | { type: 'ws-closed'; hasToken: boolean }
  | { type: 'reconnect-attempt'; elapsedMs: number }
export type ConnEffect = { type: 'mint' | 'open' | 'persist' | 'clear' | 'close' | 'revoke' } | { type: 'schedule'; delayMs: number }
export function initialConnState(): ConnState
export function nextState(s: ConnState, ev: ConnEvent): ConnState & { effects: ConnEffect[] }
export function backoffDelay(attempt: number): number
export function connectLine(lapUrl: string, token: string): string
export function resolvePointer(root: unknown, path?: string | null, opts?: { strict?: false }): unknown
export function resolvePointer(root: unknown, path: string, opts: { strict: true }): { found: true; value: unknown } | { found: false; detail: string }
export function escapePointerSegment(s: string): string
export function computeStateDiff(before: unknown, after: unknown): DiffOp[]
export function summarizeDiff(diff: DiffOp[]): string
export function toWire(value: unknown): unknown
export function fromWire(value: unknown): unknown
/** The reference runtime's validation codes. */
export type ValidationCode = 'missing' | 'unexpected-field' | 'wrong-type' | 'not-array' | 'not-object' | 'not-in-enum' | 'validates-failed'
export function validatePayload(schema: JSONSchema, value: unknown): Array<{ path: string; code: ValidationCode; message: string }>
/** A JSON Pointer into msg in the reference's style: "/cells/0/value" → "cells[0].value". */
export function referencePath(pointer: string, msg: unknown): string
export function payloadHint(variant: string, schema?: JSONSchema): Msg | null
export function fieldHints(schema?: JSONSchema): Array<{ path: string; hint: string }>
export interface ListedAction {
  variant: string; intent: string | null; requiresConfirm: boolean; dispatchMode: 'shared' | 'agent-only'
  source: 'binding' | 'always-affordable' | 'schema'; selectorHint: null; payloadHint: Msg | null
  available?: false; unavailableReason?: string; warning: string | null; examples: Msg[]; emits: string[]
  fieldHints: Array<{ path: string; hint: string }>
}
export function listActions<S>(actions: Record<string, ActionSpec<S>> | null | undefined, state: S,
  opts?: { affordances?: Array<string | Msg> | null; visible?: ((variant: string) => boolean) | null }): ListedAction[]
export function buildPolicy(actions?: Record<string, ActionSpec> | null): { variants: Record<string, object> } | null
export function buildMsgSchema(actions?: Record<string, ActionSpec> | null): { discriminant: 'type'; variants: Record<string, object> }
export function gateMessage(actions: Record<string, ActionSpec> | null, msg: unknown):
  null | { status: 'rejected'; reason: 'invalid' | 'human-only'; detail: string; errors?: Array<{ path: string; code: ValidationCode; message: string }> }
export function msgDetail(msg: Msg): string
/** A msg in the human's words: the action's summarize(msg, state), else its intent and first plain payload values. */
export function describeMsg(actions: Record<string, ActionSpec> | null | undefined, msg: Msg, state: unknown, fallbackIntent?: string): string
/** "just now", "40 s ago", "3 min ago", "2 h ago", else YYYY-MM-DD. */
export function relativeTime(at: number, now?: number): string
/** One line of the panel's activity feed. */
export interface FeedItem {
  id: string
  at: number
  tone: 'ok' | 'bad' | 'wait' | 'narrate' | 'read' | 'info'
  /** "Done", "Approved by you", "Blocked", "AI", … ('' for reads) */
  label: string
  text: string
  /** The technical part (JSON paths, codes), shown on demand. */
  detail: string
  /** Consecutive reads folded into this one. */
  count?: number
}
/** The feed's lines, newest first: an approval's outcome folded into its proposal, consecutive reads counted. */
export function feedItems(entries: LogEntry[], notes?: Map<string, { summary?: string }>): FeedItem[]
export const DEFAULT_SHORTCUT: 'Alt+Shift+A'
export interface OutlineNode { kind: 'region' | 'heading' | 'button' | 'link' | 'input' | 'list' | 'item' | 'text'; [k: string]: unknown }
export function outline(root: unknown, opts?: { maxNodes?: number; maxDepth?: number }): { outline: OutlineNode[]; source: 'data-agent' | 'fallback' | 'truncated' }
export function queryDom(root: unknown, name: string, multiple?: boolean): Array<{ text: string; attrs: Record<string, string>; path: number[] }>
