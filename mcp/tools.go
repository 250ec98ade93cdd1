package mcp

import (
	"encoding/json"

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

// Tool budget kinds (reference §2e "Budgets").
type budgetKind int

const (
	budgetRead budgetKind = iota
	budgetMessage
	budgetWait
	budgetConfirm
	budgetNone
)

// toolDef is one catalogue row. Schemas are JSON Schema 2020-12 objects; the
// optional `session` input is added to every tool.
type toolDef struct {
	name, title, desc string

	readOnly, destructive, idempotent, openWorld bool

	props    []prop   // input properties, in display order
	required []string // required inputs
	out      []prop   // documented output properties (none required; errors carry {error})

	route  string // LAP route ("" = handled locally)
	budget budgetKind
}

type prop struct {
	name   string
	schema map[string]any
}

func str(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }
func strMax(desc string, max int) map[string]any {
	return map[string]any{"type": "string", "description": desc, "maxLength": max}
}
func boolean(desc string) map[string]any {
	return map[string]any{"type": "boolean", "description": desc}
}
func integer(desc string, min, max int) map[string]any {
	return map[string]any{"type": "integer", "description": desc, "minimum": min, "maximum": max}
}
func anyv(desc string) map[string]any  { return map[string]any{"description": desc} }
func array(desc string) map[string]any { return map[string]any{"type": "array", "description": desc} }
func object(desc string) map[string]any {
	return map[string]any{"type": "object", "description": desc}
}

var sessionProp = prop{"session", strMax("Handle returned by connect_session (like s_abcdefghijklmnop). Optional when exactly one app is connected in this conversation; required when several are, or when lapd says so.", 64)}

var msgProp = prop{"msg", map[string]any{
	"type":                 "object",
	"description":          "The action to dispatch: {\"type\": \"<action name>\", ...payload fields}. observe lists the available actions with their payloads.",
	"properties":           map[string]any{"type": map[string]any{"type": "string", "minLength": 1, "maxLength": 200}},
	"required":             []string{"type"},
	"additionalProperties": true,
}}

var errorOut = prop{"error", map[string]any{
	"type":        "object",
	"description": "Present only on failures (isError): {code, detail?, retryAfterMs?, reconnect?}.",
}}

var observeOut = []prop{
	{"state", anyv("The app's current (redacted) state.")},
	{"actions", array("Actions the agent may dispatch right now, with payload hints.")},
	{"description", object("App description: name, version, stateSchema, messages, docs, conventions, schemaHash.")},
	{"context", anyv("The app's own summary of what the user is doing: {summary, hints?, cautions?} or null.")},
	{"health", object("Tab health: {connected, visible?, lastHeartbeatAt?, connectedAt?, reconnects}.")},
}

// MaxTimeoutMs bounds every timeoutMs a tool accepts.
const MaxTimeoutMs = 120000

// catalogue returns the 16 tools in their fixed, documented order.
func catalogue(mode Mode) []toolDef {
	connect := toolDef{
		name:  "connect_session",
		title: "Connect to a live app",
		desc: "Connect to a web app the user has open, using the connect line they copied from the app's \"Connect an AI\" panel. " +
			"Call this first, whenever the user pastes such a line. Pass the whole pasted text as `line`, or its parts. " +
			"Returns `session` (a handle for this app; pass it back as `session` to the other tools when several apps are connected or when lapd asks for it) " +
			"and a first observation (state, actions, description, context). Next: read the result, then use send_message to act and narrate to tell the user what you are doing.",
		idempotent: true,
		props: []prop{
			{"line", strMax("The whole connect line the user pasted (lapd finds the URL and the agt_ token in it).", MaxConnectLine)},
			{"url", strMax("LAP base URL, like http://localhost:8080/agent/lap/v1 (not needed when `line` is given).", 2048)},
			{"token", strMax("The agt_… token (not needed when `line` is given).", 512)},
		},
		out: append([]prop{
			{"status", str("\"connected\".")},
			{"session", str("Handle of this connection; pass it as `session` to other tools.")},
			{"appName", str("The app's name.")},
			{"appVersion", str("The app's version.")},
			{"next", str("What to do next.")},
		}, observeOut...),
		route: "/observe",
	}
	if mode == ModeEndpoint {
		connect.props = []prop{
			{"line", strMax("The whole connect line the user pasted (lapd finds the agt_ token in it).", MaxConnectLine)},
			{"token", strMax("The agt_… token (not needed when `line` is given).", 512)},
		}
	}
	return []toolDef{
		connect,
		{
			name:  "disconnect_session",
			title: "Disconnect from an app",
			desc: "Forget a connection made with connect_session (the given `session`, or the only one). The app tab stays open and the user can reconnect you later with a new line. " +
				"Use it when the user asks you to stop working in the app. Returns {status:\"disconnected\", session}.",
			idempotent: true,
			out:        []prop{{"status", str("\"disconnected\", or \"not-connected\" when nothing was bound.")}, {"session", str("The handle that was removed.")}},
			budget:     budgetNone,
		},
		{
			name:  "observe",
			title: "Observe the app",
			desc: "The default read: the app's current state, the actions you may dispatch right now (with payload hints), the app description and docs, and the app's context. " +
				"Call it after connecting, before deciding what to do, and whenever a result tells you things changed. " +
				"If the app was updated since you last looked, the result has schemaChanged:true; re-read the actions then.",
			readOnly: true, idempotent: true,
			out: append(append([]prop{}, observeOut...),
				prop{"schemaChanged", boolean("true when the app's message schema changed since the last observe on this session.")},
				prop{"schemaChangedNote", str("What to do about the change.")}),
			route: "/observe",
		},
		{
			name:     "describe_app",
			title:    "Describe the app",
			desc:     "The app's static description: name, version, state schema, message schemas, docs and conventions. observe already includes it; call this only to re-read the docs.",
			readOnly: true, idempotent: true,
			out: []prop{{"name", str("App name.")}, {"version", str("App version.")}, {"stateSchema", anyv("Schema of the state.")},
				{"messages", anyv("Message (action) schemas.")}, {"docs", anyv("The app's docs for agents.")}, {"conventions", object("Dispatch and confirmation model.")}, {"schemaHash", str("Changes when the schema does.")}},
			route: "/describe",
		},
		{
			name:     "get_state",
			title:    "Read app state",
			desc:     "Read the app's state, or the part at `path` (a JSON Pointer such as /todos/0). Cheaper than observe when you need only one slice. Returns {state}.",
			readOnly: true, idempotent: true,
			props: []prop{{"path", strMax("JSON Pointer into the state, like /todos/0/title. Omit for the whole state.", 1024)}},
			out:   []prop{{"state", anyv("The state (or the slice at path).")}},
			route: "/state",
		},
		{
			name:     "query_state",
			title:    "Query one value",
			desc:     "Look up one value in the app's state by `path` (JSON Pointer). Returns {found:true, value} or {found:false, detail} — use it to check a fact without reading the whole state.",
			readOnly: true, idempotent: true,
			props:    []prop{{"path", strMax("JSON Pointer into the state, like /filter.", 1024)}},
			required: []string{"path"},
			out:      []prop{{"found", boolean("Whether the path exists.")}, {"value", anyv("The value when found.")}, {"detail", str("Why not found.")}},
			route:    "/query-state",
		},
		{
			name:     "describe_recent_actions",
			title:    "Recent activity",
			desc:     "The app's recent activity log, newest first: what you and the user dispatched, with state diffs. Use it to see what changed while you were away or to check your own past steps. Returns {entries}.",
			readOnly: true, idempotent: true,
			props: []prop{{"n", integer("How many entries (default 10).", 1, 100)}, {"kind", strMax("Only entries of this kind (for example \"dispatch\" or \"narrate\").", 64)}},
			out:   []prop{{"entries", array("Log entries, newest first.")}},
			route: "/recent-actions",
		},
		{
			name:     "would_dispatch",
			title:    "Preview an action",
			desc:     "Predict what dispatching `msg` would do without committing it: the state diff and effects, or why it would be rejected. Use it before risky or unfamiliar actions. Nothing changes in the app.",
			readOnly: true, idempotent: true,
			props:    []prop{msgProp},
			required: []string{"msg"},
			out: []prop{{"status", str("predicted | rejected | reducer-threw.")}, {"stateDiff", array("JSON Patch of the predicted change.")},
				{"effects", array("Effects the action would start.")}, {"reason", str("Why it would be rejected.")}, {"errors", array("Schema errors.")}},
			route: "/would-dispatch",
		},
		{
			name:     "list_actions",
			title:    "List available actions",
			desc:     "The actions you may dispatch right now, with payload hints. observe returns the same list; use this for a cheap refresh.",
			readOnly: true, idempotent: true,
			out:   []prop{{"actions", array("Available actions.")}},
			route: "/actions",
		},
		{
			name:  "send_message",
			title: "Dispatch an action",
			desc: "Dispatch one action (`msg`) into the app, exactly as if the user did it, and wait until its effects settle. Returns {status:\"dispatched\", stateDiff (JSON Patch, not the full state), actions (the fresh list), drain}. " +
				"Actions that need the user's approval return status \"pending-confirmation\" with a confirmId: tell the user to approve it in the app, then call get_confirm_result. " +
				"Actions can change or delete the user's data: call narrate first for multi-step work. " +
				"Every call carries an idempotencyKey (lapd makes one if you give none and returns it); repeating a call with the same key never dispatches twice, so after a timeout or network error retry with the same key.",
			destructive: true, openWorld: true,
			props: []prop{
				msgProp,
				{"reason", strMax("Why you are doing this, shown to the user in the app.", 1000)},
				{"waitFor", map[string]any{"type": "string", "enum": []string{"drained", "idle", "none"}, "description": "drained (default): wait until effects settle; idle: one tick; none: return at once."}},
				{"drainQuietMs", integer("Quiet window that counts as settled (default 100).", 0, 10000)},
				{"timeoutMs", integer("How long to wait for effects to settle (default 5000).", 0, MaxTimeoutMs)},
				{"includeState", boolean("Also return the full state after (large; default false).")},
				{"idempotencyKey", strMax("Your key for safe retries (any string, at most 200 characters).", 200)},
			},
			required: []string{"msg"},
			out: []prop{{"status", str("dispatched | pending-confirmation | confirmed | rejected.")}, {"stateDiff", array("JSON Patch of the change.")},
				{"actions", array("Fresh action list.")}, {"drain", object("{effectsObserved, durationMs, timedOut, errors}.")}, {"stateAfter", anyv("Full state when includeState or after a confirmation.")},
				{"confirmId", str("Id to pass to get_confirm_result.")}, {"reason", str("Why it was rejected.")}, {"idempotencyKey", str("The key used; reuse it to retry safely.")}, {"next", str("What to do next.")}},
			route:  "/message",
			budget: budgetMessage,
		},
		{
			name:  "get_confirm_result",
			title: "Check an approval",
			desc: "After send_message returned pending-confirmation, wait (up to timeoutMs) for the user to approve or reject the action in the app. Returns {status:\"confirmed\", stateAfter}, " +
				"or status \"still-pending\" (remind the user and call again), or an error user-cancelled when they rejected it.",
			readOnly: true, idempotent: true,
			props:    []prop{{"confirmId", strMax("The confirmId from send_message.", 200)}, {"timeoutMs", integer("How long to wait for the decision (default 5000).", 0, MaxTimeoutMs)}},
			required: []string{"confirmId"},
			out:      []prop{{"status", str("confirmed | still-pending | rejected.")}, {"stateAfter", anyv("State after approval.")}, {"next", str("What to do next.")}},
			route:    "/confirm-result",
			budget:   budgetConfirm,
		},
		{
			name:     "wait_for_change",
			title:    "Wait for a change",
			desc:     "Wait (up to timeoutMs) until the app's state changes — at `path`, or anywhere — because the user or the network changed it. Use it when you asked the user to do something in the app. Returns {status:\"changed\", stateAfter} or {status:\"timeout\"}.",
			readOnly: true, idempotent: true,
			props:  []prop{{"path", strMax("JSON Pointer to watch; omit to watch everything.", 1024)}, {"timeoutMs", integer("How long to wait (default 10000).", 0, MaxTimeoutMs)}},
			out:    []prop{{"status", str("changed | timeout.")}, {"stateAfter", anyv("State after the change (null on timeout).")}},
			route:  "/wait",
			budget: budgetWait,
		},
		{
			name:     "narrate",
			title:    "Tell the user what you are doing",
			desc:     "Put one line of commentary into the app's activity feed, where the user watches you work. Call it before long or multi-step work and before anything the user should notice. Returns {ok:true}.",
			props:    []prop{{"text", strMax("One short line for the user.", 2000)}, {"intent", strMax("A label for the entry (default \"Agent narrated\").", 200)}},
			required: []string{"text"},
			out:      []prop{{"ok", boolean("true.")}},
			route:    "/narrate",
		},
		{
			name:     "query_dom",
			title:    "Read tagged page elements",
			desc:     "Read the page elements the app tagged with data-agent=\"<name>\": their text, attributes and position. Use it for what is on screen but not in the state. Returns {elements}.",
			readOnly: true, idempotent: true,
			props:    []prop{{"name", strMax("The data-agent name.", 200)}, {"multiple", boolean("Return every match, not only the first.")}},
			required: []string{"name"},
			out:      []prop{{"elements", array("[{text, attrs, path}].")}},
			route:    "/query-dom",
		},
		{
			name:     "describe_visible_content",
			title:    "Describe the visible page",
			desc:     "An outline of what the user currently sees in the app tab. Use it to talk about \"this\" or \"what's on screen\". Returns {url, outline, source}.",
			readOnly: true, idempotent: true,
			out:   []prop{{"url", str("The page URL.")}, {"outline", anyv("Outline of the visible content.")}, {"source", str("How it was built.")}},
			route: "/describe-visible",
		},
		{
			name:     "describe_context",
			title:    "What the user is doing",
			desc:     "The app's own summary of the user's current situation, with hints and cautions, plus a hint about the last dispatch. Returns {context}.",
			readOnly: true, idempotent: true,
			out:   []prop{{"context", anyv("{summary, hints?, cautions?}.")}},
			route: "/context",
		},
	}
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

// mcpTool renders a catalogue row as an mcp-go Tool with all four
// annotations set explicitly (mcp-go fills unset ones with the spec's
// pessimistic defaults).
func (d toolDef) mcpTool() mcpgo.Tool {
	in := append([]prop{}, d.props...)
	in = append(in, sessionProp)
	out := append([]prop{}, d.out...)
	out = append(out, errorOut)
	t := mcpgo.NewTool(d.name,
		mcpgo.WithToolTitle(d.title),
		mcpgo.WithDescription(d.desc),
		mcpgo.WithRawInputSchema(schemaOf(in, d.required, true)),
		mcpgo.WithRawOutputSchema(schemaOf(out, nil, false)),
		mcpgo.WithTitleAnnotation(d.title),
		mcpgo.WithReadOnlyHintAnnotation(d.readOnly),
		mcpgo.WithDestructiveHintAnnotation(d.destructive),
		mcpgo.WithIdempotentHintAnnotation(d.idempotent),
		mcpgo.WithOpenWorldHintAnnotation(d.openWorld),
	)
	t.InputSchema = mcpgo.ToolInputSchema{} // the raw schema is the one; mcp-go refuses both
	return t
}

// Tools returns the catalogue for mode as mcp-go tools, in the fixed order
// of docs/TOOLS.md.
func Tools(mode Mode) []mcpgo.Tool {
	defs := catalogue(mode)
	out := make([]mcpgo.Tool, len(defs))
	for i, d := range defs {
		out[i] = d.mcpTool()
	}
	return out
}

// Instructions is the server's `instructions`: the workflow in a paragraph
// the model reads once.
const Instructions = `lapd lets you drive a live web app the user has open in a browser tab, while they watch.
1. Connect: when the user pastes a line from the app's "Connect an AI" panel, call connect_session with it (pass the whole text as line). It returns a session handle and a first observation. If you have no line, ask the user to click "Connect an AI" in the app and paste what it shows.
2. Look: observe returns the state, the actions you may dispatch now, the app's docs and context. Read them before acting.
3. Act: send_message dispatches one action and returns a state diff and the fresh action list. Before long or multi-step work, call narrate so the user sees what you are about to do.
4. Approvals: some actions return status pending-confirmation with a confirmId. Tell the user to approve (or reject) it in the app, then call get_confirm_result with the confirmId until it is confirmed or rejected.
5. Humans: actions marked human-only must be done by the user; ask them. To notice what the user changes, call wait_for_change.
Several apps can be connected at once: pass the session handle to every tool then. Every error starts with a code and says what to do next; follow it (for example, wait and retry when the app tab is reconnecting).`
