package mcp

import (
	"encoding/json"
	"fmt"
	"strings"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// Mode selects the connect_session variant and where LAP calls go.
type Mode int

const (
	// ModeBridge is `lapd mcp` over stdio: connect_session takes {url, token}
	// (or the pasted line) and LAP calls go over HTTP to that URL.
	ModeBridge Mode = iota
	// ModeEndpoint is /agent/mcp inside `lapd serve`: connect_session takes
	// {token} (or the line); the in-process client ignores the base URL.
	ModeEndpoint
)

// ToolSet selects which tools a server lists. Every tool definition a model
// is given costs it input on every turn, so the default is the core set,
// which covers the whole connect → act → approve → narrate flow.
type ToolSet int

const (
	// ToolsCore (the default): connect_session, observe, send_message,
	// get_confirm_result, wait_for_change, narrate.
	ToolsCore ToolSet = iota
	// ToolsAll: the core plus disconnect_session, describe_app, get_state,
	// query_state, describe_recent_actions, would_dispatch, list_actions,
	// query_dom, describe_visible_content, describe_context (16 tools).
	ToolsAll
)

// ParseToolSet parses the --tools flag: "core" or "all".
func ParseToolSet(s string) (ToolSet, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "core":
		return ToolsCore, nil
	case "all":
		return ToolsAll, nil
	}
	return 0, fmt.Errorf("tools must be core or all, not %q", s)
}

func (t ToolSet) String() string {
	if t == ToolsAll {
		return "all"
	}
	return "core"
}

// Tool budget kinds (reference §2e "Budgets").
type budgetKind int

const (
	budgetRead budgetKind = iota
	budgetMessage
	budgetWait
	budgetConfirm
	budgetNone
)

// toolDef is one catalogue row. Schemas are JSON Schema 2020-12 objects.
type toolDef struct {
	name, title, desc string
	core              bool // listed with --tools core

	readOnly, destructive, idempotent, openWorld bool

	props    []prop   // input properties, in display order
	required []string // required inputs
	out      []prop   // documented output properties (none required; errors carry {error})
	noSess   bool     // no `session` input (connect_session)
	ignored  []string // string arguments accepted and dropped, unlisted (the endpoint's connect_session url)

	route  string // LAP route ("" = handled locally)
	budget budgetKind
}

type prop struct {
	name   string
	schema map[string]any
	doc    string // longer description for docs/TOOLS.md (outputs)
}

func strp(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }
func strMax(desc string, max int) map[string]any {
	return map[string]any{"type": "string", "description": desc, "maxLength": max}
}
func boolean(desc string) map[string]any {
	return map[string]any{"type": "boolean", "description": desc}
}
func integer(desc string, min, max int) map[string]any {
	return map[string]any{"type": "integer", "description": desc, "minimum": min, "maximum": max}
}

// out describes one output property: its JSON type ("" = any) and a sentence
// for docs/TOOLS.md. The output schema lists names and types only.
func out(name, typ, doc string) prop {
	s := map[string]any{}
	if typ != "" {
		s["type"] = typ
	}
	return prop{name: name, schema: s, doc: doc}
}

var sessionProp = prop{name: "session", schema: strMax("Handle from connect_session.", 64)}

var verboseProp = prop{name: "verbose", schema: boolean("Every field LAP returns (default: only what is new or not default).")}

// MaxBatch bounds the messages of one send_message.
const MaxBatch = 20

var msgSchema = map[string]any{
	"type":                 "object",
	"properties":           map[string]any{"type": map[string]any{"type": "string", "minLength": 1, "maxLength": 200}},
	"required":             []string{"type"},
	"additionalProperties": true,
}

var msgProp = prop{name: "msg", schema: map[string]any{
	"type":                 "object",
	"description":          `One action: {"type": "<action>", ...payload}.`,
	"properties":           msgSchema["properties"],
	"required":             msgSchema["required"],
	"additionalProperties": true,
}}

var msgsProp = prop{name: "msgs", schema: map[string]any{
	"type":        "array",
	"description": "Several actions, dispatched in order; stops at the first not dispatched.",
	"items":       msgSchema,
	"minItems":    1,
	"maxItems":    MaxBatch,
}}

var errorOut = out("error", "object", "Only on failures (isError): {code, detail?, retryAfterMs?, reconnect?}.")

// MaxTimeoutMs bounds every timeoutMs a tool accepts.
const MaxTimeoutMs = 120000

// observeOut are the sections of an observation (observe, connect_session).
var observeOut = []prop{
	out("state", "", "The app's current (redacted) state. connect_session keeps it under 1 KiB by leaving out the largest top-level parts (see stateOmitted); observe returns all of it."),
	out("stateOmitted", "object", "{\"/pointer\": \"50 items, 3.3 KB\"}: parts of the state left out for size; observe returns them."),
	out("actions", "array", "Actions you may dispatch now: {variant, intent?, payload? (a TypeScript-like signature of the fields), requiresConfirm?, warning?, examples?, unavailable? (why not now)}."),
	out("docs", "", "The app's docs for agents."),
	out("stateSchema", "", "The app's state schema, when it declares one."),
	out("context", "", "The app's summary of what the user is doing: {summary, hints?, cautions?}."),
	out("health", "object", "Only when something is wrong with the tab: {connected, visible?, lastHeartbeatAt?, connectedAt?, reconnects}."),
}

// catalogue returns the 16 tools in their fixed, documented order.
func catalogue(mode Mode) []toolDef {
	connect := toolDef{
		name:  "connect_session",
		title: "Connect to a live app",
		core:  true,
		desc: "Connect to a web app the user has open. Call it when the user pastes a line from the app's \"Connect an AI\" panel (pass the whole text as line). " +
			"Returns a session handle (pass it on every later call) and the first observation: state, the actions you may dispatch with their payloads, docs, context. Act on it; no observe needed.",
		idempotent: true, noSess: true,
		props: []prop{
			{name: "line", schema: strMax("The pasted connect line.", MaxConnectLine)},
			{name: "url", schema: strMax("LAP base URL (only without line).", 2048)},
			{name: "token", schema: strMax("The agt_ token (only without line).", 512)},
			verboseProp,
		},
		out: append([]prop{
			out("status", "string", "\"connected\"."),
			out("session", "string", "Handle of this connection; pass it as session to the other tools."),
			out("appName", "string", "The app's name."),
			out("appVersion", "string", "The app's version."),
		}, append(append([]prop{}, observeOut...), out("next", "string", "What to do next."))...),
		route: "/observe",
	}
	if mode == ModeEndpoint {
		connect.props = []prop{connect.props[0], connect.props[2], verboseProp}
		// Models trained on the reference's bridge send {url, token} to the
		// endpoint too (its connect_session takes {token}, and its schema
		// library drops the url); the endpoint is its own LAP base, so a
		// url is dropped here as well instead of costing a refused call.
		connect.ignored = []string{"url"}
	}
	return []toolDef{
		connect,
		{
			name:  "disconnect_session",
			title: "Disconnect from an app",
			desc: "Forget a connection made with connect_session (the given session, or the only one). The app tab stays open; the user can reconnect you with a new line. " +
				"Use it when the user asks you to stop. Returns {status:\"disconnected\", session}.",
			idempotent: true,
			out:        []prop{out("status", "string", "\"disconnected\", or \"not-connected\" when nothing was bound."), out("session", "string", "The handle that was removed.")},
			budget:     budgetNone,
		},
		{
			name:  "observe",
			title: "Observe the app",
			core:  true,
			desc: "The whole picture: the current state, the actions you may dispatch now (with payloads), docs and context. " +
				"connect_session and send_message results already keep you current; call this when you need the whole state again or suspect the user changed things.",
			readOnly: true, idempotent: true,
			props: []prop{verboseProp},
			out: append(append([]prop{out("appName", "string", "The app's name."), out("appVersion", "string", "The app's version.")}, observeOut...),
				out("schemaChanged", "boolean", "true when the app's message schema changed since the last look at this session."),
				out("schemaChangedNote", "string", "What to do about the change.")),
			route: "/observe",
		},
		{
			name:     "describe_app",
			title:    "Describe the app",
			desc:     "The app's static description as LAP returns it: name, version, state schema, message schemas, docs and conventions. observe includes what a model needs of it.",
			readOnly: true, idempotent: true,
			out: []prop{out("name", "string", "App name."), out("version", "string", "App version."), out("stateSchema", "", "Schema of the state."),
				out("messages", "", "Message (action) schemas."), out("docs", "", "The app's docs for agents."), out("conventions", "object", "Dispatch and confirmation model."), out("schemaHash", "string", "Changes when the schema does.")},
			route: "/describe",
		},
		{
			name:     "get_state",
			title:    "Read app state",
			desc:     "Read the app's state, or the part at path (a JSON Pointer such as /todos/0). Returns {state}.",
			readOnly: true, idempotent: true,
			props: []prop{{name: "path", schema: strMax("JSON Pointer, like /todos/0/title (omit for all).", 1024)}},
			out:   []prop{out("state", "", "The state (or the part at path).")},
			route: "/state",
		},
		{
			name:     "query_state",
			title:    "Query one value",
			desc:     "Look up one value in the app's state by path (JSON Pointer). Returns {found:true, value} or {found:false, detail}.",
			readOnly: true, idempotent: true,
			props:    []prop{{name: "path", schema: strMax("JSON Pointer, like /filter.", 1024)}},
			required: []string{"path"},
			out:      []prop{out("found", "boolean", "Whether the path exists."), out("value", "", "The value when found."), out("detail", "string", "Why not found.")},
			route:    "/query-state",
		},
		{
			name:     "describe_recent_actions",
			title:    "Recent activity",
			desc:     "The app's recent activity log, newest first: what you and the user dispatched, with state diffs. Returns {entries}.",
			readOnly: true, idempotent: true,
			props: []prop{{name: "n", schema: integer("How many entries (default 10).", 1, 100)}, {name: "kind", schema: strMax("Only entries of this kind (\"dispatch\", \"narrate\", …).", 64)}},
			out:   []prop{out("entries", "array", "Log entries, newest first.")},
			route: "/recent-actions",
		},
		{
			name:     "would_dispatch",
			title:    "Preview an action",
			desc:     "Predict what dispatching msg would do, without doing it: the state diff, or why it would be rejected.",
			readOnly: true, idempotent: true,
			props:    []prop{msgProp},
			required: []string{"msg"},
			out: []prop{out("status", "string", "predicted | rejected | reducer-threw."), out("stateDiff", "array", "JSON Patch of the predicted change."),
				out("effects", "array", "Effects the action would start."), out("reason", "string", "Why it would be rejected."), out("errors", "array", "Schema errors.")},
			route: "/would-dispatch",
		},
		{
			name:     "list_actions",
			title:    "List available actions",
			desc:     "The actions you may dispatch now, with payloads (observe includes them).",
			readOnly: true, idempotent: true,
			props: []prop{verboseProp},
			out:   []prop{out("actions", "array", "Available actions (see observe).")},
			route: "/actions",
		},
		{
			name:  "send_message",
			title: "Dispatch actions",
			core:  true,
			desc: "Dispatch actions into the app as if the user did them, and wait until their effects settle: one as msg, or several as msgs (in order; stops at the first not dispatched). " +
				"Returns status, stateDiff (JSON Patch) and, only when your options changed, actionsChanged. " +
				"An action with requiresConfirm waits up to approvalTimeoutMs for the user to approve it in the app: confirmed (its stateAfter is the current state) or pending-confirmation (tell the user, then call get_confirm_result). " +
				"rejected says why. Retrying with the same idempotencyKey never dispatches twice.",
			destructive: true, openWorld: true,
			props: []prop{
				msgProp,
				msgsProp,
				{name: "reason", schema: strMax("Why, shown to the user.", 1000)},
				{name: "approvalTimeoutMs", schema: integer("Wait for the user's approval (default 20000; 0: return pending-confirmation at once).", 0, MaxTimeoutMs)},
				{name: "timeoutMs", schema: integer("Wait for effects to settle, per action (default 5000).", 0, MaxTimeoutMs)},
				{name: "waitFor", schema: map[string]any{"type": "string", "enum": []string{"drained", "idle", "none"}, "description": "drained (default): effects settled; idle: one tick; none: at once."}},
				{name: "drainQuietMs", schema: integer("Quiet time that counts as settled (default 100).", 0, 10000)},
				{name: "includeState", schema: boolean("Also return the whole state after.")},
				{name: "idempotencyKey", schema: strMax("Key for safe retries (msgs use key#1, key#2, …).", 200)},
				verboseProp,
			},
			out: []prop{
				out("status", "string", "dispatched | pending-confirmation | confirmed | rejected; for msgs, dispatched when all were, else the status of the one that stopped the batch."),
				out("results", "array", "msgs only: one {status, …} per message, in order (not-sent after a stop); left out when all were dispatched with nothing to add."),
				out("stateDiff", "array", "JSON Patch of the change (for msgs: all messages, combined; after a confirmed one, the change on top of its stateAfter; when the approved state is over 1 KiB and lapd knows what you last saw, the change since then, with no stateAfter)."),
				out("stateAfter", "", "The state after a confirmed action (kept under 1 KiB, see stateOmitted), or after all with includeState."),
				out("stateOmitted", "object", "Parts of stateAfter left out for size."),
				out("actionsChanged", "array", "Only when the action list changed since you were last shown it: new entries in full, changed ones as JSON merge patches {variant, changed fields (null = gone)}, removed ones {variant, removed:true}."),
				out("actions", "array", "The whole action list, when you were never shown one (or with verbose)."),
				out("drain", "object", "Only when effects failed or did not settle in time: {effectsObserved, durationMs, timedOut, errors}."),
				out("confirmId", "string", "pending-confirmation: pass it to get_confirm_result."),
				out("reason", "string", "rejected: human-only | schema-error | invalid | user-cancelled | …"),
				out("detail", "string", "rejected: what was wrong."),
				out("errors", "array", "schema-error: the payload's errors."),
				out("idempotencyKey", "string", "On failures (and with verbose): the key used; retry with it."),
				out("next", "string", "What to do next, when it is not obvious."),
			},
			route:  "/message",
			budget: budgetMessage,
		},
		{
			name:  "get_confirm_result",
			title: "Check an approval",
			core:  true,
			desc: "After pending-confirmation: wait up to timeoutMs for the user's decision in the app. " +
				"Returns confirmed (stateAfter is the current state), still-pending (remind the user, call again) or rejected.",
			readOnly: true, idempotent: true,
			props:    []prop{{name: "confirmId", schema: strMax("From send_message.", 200)}, {name: "timeoutMs", schema: integer("Wait for the decision (default 20000).", 0, MaxTimeoutMs)}},
			required: []string{"confirmId"},
			out: []prop{out("status", "string", "confirmed | still-pending | rejected."), out("stateAfter", "", "The state after approval (kept under 1 KiB)."), out("stateDiff", "array", "Instead of stateAfter, for a state over 1 KiB: JSON Patch from the state you last saw."),
				out("stateOmitted", "object", "Parts of stateAfter left out for size."), out("reason", "string", "rejected: why (user-cancelled, timeout, …)."), out("next", "string", "What to do next.")},
			route:  "/confirm-result",
			budget: budgetConfirm,
		},
		{
			name:  "wait_for_change",
			title: "Wait for a change",
			core:  true,
			desc: "Wait up to timeoutMs until the state changes (at path, or anywhere) because the user or the network changed it; use it when you asked the user to do something. " +
				"Returns {status:\"changed\", value} (the part at path; without path, stateDiff: what changed since you last saw the state, or stateAfter, the whole state) or {status:\"timeout\"}.",
			readOnly: true, idempotent: true,
			props:  []prop{{name: "path", schema: strMax("JSON Pointer to watch (omit for all).", 1024)}, {name: "timeoutMs", schema: integer("Wait this long (default 10000).", 0, MaxTimeoutMs)}},
			out:    []prop{out("status", "string", "changed | timeout."), out("value", "", "With path: the value there after the change (found:false: none)."), out("stateDiff", "array", "Without path, for a state over 1 KiB: JSON Patch from the state your results last showed you (as send_message's), when shorter than the state."), out("stateAfter", "", "Without path: the whole state, when it is small or shorter, or lapd cannot tell what you saw.")},
			route:  "/wait",
			budget: budgetWait,
		},
		{
			name:     "narrate",
			title:    "Tell the user what you are doing",
			core:     true,
			desc:     "Show one line in the app's activity feed, where the user watches you work. Use it before multi-step work. Returns {ok:true}.",
			props:    []prop{{name: "text", schema: strMax("One short line.", 2000)}, {name: "intent", schema: strMax("Entry label (default \"Agent narrated\").", 200)}},
			required: []string{"text"},
			out:      []prop{out("ok", "boolean", "true.")},
			route:    "/narrate",
		},
		{
			name:     "query_dom",
			title:    "Read tagged page elements",
			desc:     "Read the page elements the app tagged data-agent=\"<name>\": text, attributes, position. For what is on screen but not in the state. Returns {elements}.",
			readOnly: true, idempotent: true,
			props:    []prop{{name: "name", schema: strMax("The data-agent name.", 200)}, {name: "multiple", schema: boolean("Every match, not only the first.")}},
			required: []string{"name"},
			out:      []prop{out("elements", "array", "[{text, attrs, path}].")},
			route:    "/query-dom",
		},
		{
			name:     "describe_visible_content",
			title:    "Describe the visible page",
			desc:     "An outline of what the user sees in the app tab, to talk about \"this\" or \"what's on screen\". Returns {url, outline, source}.",
			readOnly: true, idempotent: true,
			out:   []prop{out("url", "string", "The page URL."), out("outline", "", "Outline of the visible content."), out("source", "string", "How it was built.")},
			route: "/describe-visible",
		},
		{
			name:     "describe_context",
			title:    "What the user is doing",
			desc:     "The app's summary of the user's situation, with hints and cautions, plus a note on your last dispatch. Returns {context}.",
			readOnly: true, idempotent: true,
			out:   []prop{out("context", "", "{summary, hints?, cautions?}.")},
			route: "/context",
		},
	}
}

// selectTools keeps the rows of set.
func selectTools(defs []toolDef, set ToolSet) []toolDef {
	if set == ToolsAll {
		return defs
	}
	out := make([]toolDef, 0, len(defs))
	for _, d := range defs {
		if d.core {
			out = append(out, d)
		}
	}
	return out
}

func schemaOf(props []prop, required []string, closed bool) json.RawMessage {
	ps := map[string]any{}
	for _, p := range props {
		ps[p.name] = p.schema
	}
	s := map[string]any{"type": "object", "properties": ps}
	if len(required) > 0 {
		s["required"] = required
	}
	if closed {
		s["additionalProperties"] = false
	}
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // static data
	}
	return b
}

// inputs are the tool's input properties, session last.
func (d toolDef) inputs() []prop {
	in := append([]prop{}, d.props...)
	if !d.noSess {
		in = append(in, sessionProp)
	}
	return in
}

// mcpTool renders a catalogue row as an mcp-go Tool with all four
// annotations set explicitly (mcp-go fills unset ones with the spec's
// pessimistic defaults). The output schema lists property names and types
// only (a model never reads it; a client may validate against it); the
// sentences are in docs/TOOLS.md.
func (d toolDef) mcpTool() mcpgo.Tool {
	outs := append([]prop{}, d.out...)
	outs = append(outs, errorOut)
	t := mcpgo.NewTool(d.name,
		mcpgo.WithToolTitle(d.title),
		mcpgo.WithDescription(d.desc),
		mcpgo.WithRawInputSchema(schemaOf(d.inputs(), d.required, true)),
		mcpgo.WithRawOutputSchema(schemaOf(outs, nil, false)),
		mcpgo.WithTitleAnnotation(d.title),
		mcpgo.WithReadOnlyHintAnnotation(d.readOnly),
		mcpgo.WithDestructiveHintAnnotation(d.destructive),
		mcpgo.WithIdempotentHintAnnotation(d.idempotent),
		mcpgo.WithOpenWorldHintAnnotation(d.openWorld),
	)
	t.InputSchema = mcpgo.ToolInputSchema{} // the raw schema is the one; mcp-go refuses both
	return t
}

// Tools returns the tools of set for mode as mcp-go tools, in the fixed
// order of docs/TOOLS.md.
func Tools(mode Mode, set ToolSet) []mcpgo.Tool {
	defs := selectTools(catalogue(mode), set)
	out := make([]mcpgo.Tool, len(defs))
	for i, d := range defs {
		out[i] = d.mcpTool()
	}
	return out
}

// Instructions is the server's `instructions`: the workflow in a paragraph
// the model reads once. It names only core tools.
const Instructions = `lapd connects you to a web app the user has open in a browser tab; they watch you work and approve risky actions there.
1. When the user pastes a line from the app's "Connect an AI" panel, call connect_session with it (line = the whole text). Its result is your first observation: state, the actions you may dispatch with their payloads, docs and context. Act on it: no observe needed. Pass its session handle on every later call.
2. Act with send_message: one action as msg, or several as msgs (dispatched in order). Each result has a stateDiff and, only when your options changed, actionsChanged. Call narrate once before multi-step work.
3. An action with requiresConfirm waits (approvalTimeoutMs, default 20 s) for the user to approve it in the app. confirmed: it ran, and stateAfter is the current state. pending-confirmation: tell the user, then call get_confirm_result. rejected (human-only, schema-error, user-cancelled, …) is an answer, not a failure: follow its next.
4. observe gives the whole picture again; wait_for_change waits for the user's own edits.
Errors (isError) start with a code and say what to do; follow them.`
