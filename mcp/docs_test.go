package mcp

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/tools.golden.json and docs/TOOLS.md")

// golden compares got with the file at path, or rewrites it with -update.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./mcp -run %s -update)", err, t.Name())
	}
	if !bytes.Equal(want, got) {
		t.Fatalf("%s is stale: run go test ./mcp -run %s -update and review the diff", path, t.Name())
	}
}

func TestToolsGolden(t *testing.T) {
	t.Parallel()
	snap := map[string]any{"bridge": Tools(ModeBridge, ToolsAll), "endpoint": Tools(ModeEndpoint, ToolsAll)[:1]}
	b, err := json.MarshalIndent(snap, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "testdata/tools.golden.json", append(b, '\n'))
}

func TestToolsDoc(t *testing.T) {
	t.Parallel()
	golden(t, "../docs/TOOLS.md", []byte(renderToolsDoc()))
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func renderToolsDoc() string {
	var w strings.Builder
	w.WriteString("# lapd MCP tools\n\n")
	w.WriteString("<!-- Generated from mcp/tools.go by `go test ./mcp -run TestToolsDoc -update`. Do not edit by hand. -->\n\n")
	w.WriteString("lapd serves the same tools over stdio (`lapd mcp`, the bridge) and over Streamable HTTP at `/agent/mcp` (the endpoint). ")
	w.WriteString("By default it lists the six **core** tools, which cover the whole flow (connect, act, approve, narrate); `--tools all` (on `lapd serve` and `lapd mcp`) lists all 16. The other ten answer when called by name either way (a client or prompt written for the reference's bridge keeps working); only the list, which the model reads, is shorter. ")
	w.WriteString("Every tool but `connect_session` takes an optional `session` argument.\n\n")
	w.WriteString("## The lean flow\n\n")
	w.WriteString(leanDoc)
	w.WriteString("\n## Sessions and handles\n\n")
	w.WriteString(sessionsDoc)
	w.WriteString("\n## Server instructions\n\n```text\n" + Instructions + "\n```\n\n")
	w.WriteString("Prompt `connect` (argument `line`): renders a user message asking the model to call `connect_session` with the pasted line.\n\n")
	w.WriteString("## Tools\n\n| tool | set | title | LAP route | read-only | destructive | idempotent | open-world |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, d := range catalogue(ModeBridge) {
		route := d.route
		if route == "" {
			route = "–"
		}
		set := "all"
		if d.core {
			set = "core"
		}
		fmt.Fprintf(&w, "| `%s` | %s | %s | `%s` | %s | %s | %s | %s |\n", d.name, set, d.title, route, yes(d.readOnly), yes(d.destructive), yes(d.idempotent), yes(d.openWorld))
	}
	endpoint := catalogue(ModeEndpoint)[0]
	for _, d := range catalogue(ModeBridge) {
		fmt.Fprintf(&w, "\n### `%s` — %s\n\n%s\n\n", d.name, d.title, d.desc)
		w.WriteString("| input | type | required | description |\n| --- | --- | --- | --- |\n")
		req := map[string]bool{}
		for _, r := range d.required {
			req[r] = true
		}
		for _, p := range d.inputs() {
			desc, _ := p.schema["description"].(string)
			typ, _ := p.schema["type"].(string)
			if typ == "" {
				typ = "any"
			}
			if e, ok := p.schema["enum"].([]string); ok {
				typ = strings.Join(e, " \\| ")
			}
			fmt.Fprintf(&w, "| `%s` | %s | %s | %s |\n", p.name, typ, yes(req[p.name]), desc)
		}
		if d.name == "connect_session" {
			var names []string
			for _, p := range endpoint.props {
				names = append(names, "`"+p.name+"`")
			}
			fmt.Fprintf(&w, "\nOn the HTTP endpoint `connect_session` takes only %s: the base URL is lapd itself (a `url`, which the reference's bridge takes, is accepted and ignored).\n", strings.Join(names, ", "))
		}
		w.WriteString("\n| output | type | description |\n| --- | --- | --- |\n")
		for _, p := range append(append([]prop{}, d.out...), errorOut) {
			typ, _ := p.schema["type"].(string)
			if typ == "" {
				typ = "any"
			}
			fmt.Fprintf(&w, "| `%s` | %s | %s |\n", p.name, typ, p.doc)
		}
	}
	w.WriteString("\n## Budgets and retries\n\n")
	w.WriteString("Reads, `narrate` and `connect_session`: 20 s. `send_message`: the larger of `timeoutMs` (5000) and `approvalTimeoutMs` (20000), + 2 s, per message. `wait_for_change`: `timeoutMs` (10000) + 2 s. ")
	w.WriteString("`get_confirm_result`: `timeoutMs` (20000) + 2 s. Within its budget a call retries a 503 `paused` with `reconnect: pending` and a 429 ")
	w.WriteString("after their `Retry-After` (a paused session is polled at least every 2 s: its `Retry-After` is the grace window left, not when the tab is back; at most 8 retries), re-sending the same body, so every message keeps its idempotency key. ")
	w.WriteString("While a call waits, a client that sent a progress token gets `notifications/progress` about once a second.\n")
	return w.String()
}

// leanDoc is "The lean flow" (also summarised in doc.go and lean.go).
const leanDoc = "Every byte a tool returns is read by the model on every later turn, so results say only what is new and not default. " +
	"The cheapest correct path, which the server instructions and every `next` hint describe:\n\n" +
	"1. `connect_session` with the pasted line. Its result is the first observation (state, actions with a payload signature each, docs, context): no `observe` after it. " +
	"It keeps the state under 1 KiB by leaving out its largest top-level parts, named in `stateOmitted` (`observe` returns them).\n" +
	"2. `narrate` once before multi-step work.\n" +
	"3. `send_message` with `msgs: [...]` for several steps: dispatched in order, each with its own idempotency key (`key#1`, `key#2`, …) and its own audit entry, " +
	"stopping at the first that is not dispatched; one combined `stateDiff` and a `status` per message. " +
	"The action list comes back only when it changed since the model was last shown it, as `actionsChanged`.\n" +
	"4. An action that needs approval waits `approvalTimeoutMs` (default 20 s) for the user: `confirmed` carries `stateAfter`, which is current (no `observe`); " +
	"`pending-confirmation` (or `approvalTimeoutMs: 0`, to return at once) is followed by `get_confirm_result`.\n\n" +
	"Lean rendering: action entries drop null, empty and default fields (`source`, `selectorHint: null`, `examples: []`, `requiresConfirm: false`, `dispatchMode: \"shared\"`); " +
	"an unavailable action has `unavailable: \"<reason>\"`; `payload` is a TypeScript-like signature built from the app's message schemas " +
	"(`{title: string /* Short task title */, column?: 'todo'|'doing'|'done'}`) in place of `payloadHint` and `fieldHints`. " +
	"Observations keep `docs` (and `stateSchema` when the app declares one), not the LAP description's conventions or message schemas; `health` appears only when the tab is disconnected or hidden. " +
	"A dispatch result omits `drain` unless effects failed or timed out (then each error keeps its `kind` and `message`, not the JS stack, and `next` says what to do), and the idempotency key unless the call failed. " +
	"Nothing is hidden from a model that asks: `observe` always returns the whole picture, and `verbose: true` returns the LAP body as it came.\n\n" +
	"Results are JSON objects: `structuredContent` and the text content are the same compact bytes (no indentation, no nulls where lapd adds them), encoded once. " +
	"A refusal by the app, its policy or the user (`rejected` with `reason` human-only, invalid, schema-error, user-cancelled, …; `pending-confirmation`) is a result with `isError: false`, " +
	"a `status`, a `reason` and a `next` hint. `isError` is kept for failures of the tool itself: its text starts with a code (`paused: the app tab is reconnecting; retry in 5 s …`) " +
	"and `structuredContent.error` is `{code, detail?, retryAfterMs?, reconnect?}`.\n"

// sessionsDoc is the "Sessions and handles" section (also summarised in doc.go).
const sessionsDoc = "`connect_session` returns a handle `session` (`s_` + 16 base32 characters, 80 random bits). " +
	"The handle names one binding {LAP base URL, token, app name, schema hash}; tokens stay in lapd's memory and are never logged or returned.\n\n" +
	"- **stdio (`lapd mcp`)**: the whole process is one caller. With exactly one binding, tools use it when `session` is omitted; " +
	"with several, an omitted `session` is an error (`session-required`) that lists the handles and app names.\n" +
	"- **HTTP, legacy clients (≤ 2025-11-25)**: bindings are scoped to the MCP session id; the same defaulting applies inside one MCP session, " +
	"and a `DELETE` (or the session's expiry/eviction) drops its bindings. A call that names a handle uses it from any MCP session, or none: the handle is the capability, as below.\n" +
	"- **HTTP, modern clients (2026-07-28)**: there is no MCP session, so there is no default either: pass `session` on every call. " +
	"Bindings are global to the server instance, and the unguessable handle is the capability (a client that does not know it cannot use it).\n\n" +
	"Bounds: 256 bindings in all (a full table evicts the least recently used binding of the token holding the most), 16 per caller (an MCP session or the stdio bridge; modern HTTP clients have none), 8 per token (the least recently used is evicted), idle bindings expire after 30 min. " +
	"Connecting again with the same line in the same scope returns the same handle. `disconnect_session` removes one binding.\n"
