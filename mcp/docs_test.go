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
	snap := map[string]any{"bridge": Tools(ModeBridge), "endpoint": Tools(ModeEndpoint)[:1]}
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
	w.WriteString("lapd serves the same 16 tools over stdio (`lapd mcp`, the bridge) and over Streamable HTTP at `/agent/mcp` (the endpoint). ")
	w.WriteString("Every tool takes an optional `session` argument. Results carry `structuredContent` plus the same JSON as text; ")
	w.WriteString("failures are `isError` results whose text starts with a code (`paused: the app tab is reconnecting; retry in 5 s …`) and whose ")
	w.WriteString("`structuredContent.error` is `{code, detail?, retryAfterMs?, reconnect?}`.\n\n")
	w.WriteString("## Sessions and handles\n\n")
	w.WriteString(sessionsDoc)
	w.WriteString("\n## Server instructions\n\n```text\n" + Instructions + "\n```\n\n")
	w.WriteString("Prompt `connect` (argument `line`): renders a user message asking the model to call `connect_session` with the pasted line.\n\n")
	w.WriteString("## Tools\n\n| tool | title | LAP route | read-only | destructive | idempotent | open-world |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, d := range catalogue(ModeBridge) {
		route := d.route
		if route == "" {
			route = "–"
		}
		fmt.Fprintf(&w, "| `%s` | %s | `%s` | %s | %s | %s | %s |\n", d.name, d.title, route, yes(d.readOnly), yes(d.destructive), yes(d.idempotent), yes(d.openWorld))
	}
	endpoint := catalogue(ModeEndpoint)[0]
	for _, d := range catalogue(ModeBridge) {
		fmt.Fprintf(&w, "\n### `%s` — %s\n\n%s\n\n", d.name, d.title, d.desc)
		w.WriteString("| input | type | required | description |\n| --- | --- | --- | --- |\n")
		req := map[string]bool{}
		for _, r := range d.required {
			req[r] = true
		}
		for _, p := range append(append([]prop{}, d.props...), sessionProp) {
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
			fmt.Fprintf(&w, "\nOn the HTTP endpoint `connect_session` takes only %s (plus `session`): the base URL is lapd itself.\n", strings.Join(names, ", "))
		}
		w.WriteString("\nOutput: ")
		var outs []string
		for _, p := range d.out {
			outs = append(outs, "`"+p.name+"`")
		}
		w.WriteString(strings.Join(outs, ", ") + ".\n")
	}
	w.WriteString("\n## Budgets and retries\n\n")
	w.WriteString("Reads, `narrate` and `connect_session`: 20 s. `send_message`: `timeoutMs` (5000) + 2 s. `wait_for_change`: `timeoutMs` (10000) + 2 s. ")
	w.WriteString("`get_confirm_result`: `timeoutMs` (5000) + 2 s. Within its budget a call retries a 503 `paused` with `reconnect: pending` and a 429 ")
	w.WriteString("after their `Retry-After` (at most 8 retries), re-sending the same body, so `send_message` keeps its `idempotencyKey`. ")
	w.WriteString("While a call waits, a client that sent a progress token gets `notifications/progress` about once a second.\n")
	return w.String()
}

// sessionsDoc is the "Sessions and handles" section (also summarised in doc.go).
const sessionsDoc = "`connect_session` returns a handle `session` (`s_` + 16 base32 characters, 80 random bits). " +
	"The handle names one binding {LAP base URL, token, app name, schema hash}; tokens stay in lapd's memory and are never logged or returned.\n\n" +
	"- **stdio (`lapd mcp`)**: the whole process is one caller. With exactly one binding, tools use it when `session` is omitted; " +
	"with several, an omitted `session` is an error (`session-required`) that lists the handles and app names.\n" +
	"- **HTTP, legacy clients (≤ 2025-11-25)**: bindings are scoped to the MCP session id; the same defaulting applies inside one MCP session, " +
	"and a `DELETE` (or the session's expiry/eviction) drops its bindings.\n" +
	"- **HTTP, modern clients (2026-07-28)**: there is no MCP session, so there is no default either: pass `session` on every call. " +
	"Bindings are global to the server instance, and the unguessable handle is the capability (a client that does not know it cannot use it).\n\n" +
	"Bounds: 256 bindings in all, 16 per caller, 8 per token (the least recently used is evicted), idle bindings expire after 30 min. " +
	"Connecting again with the same line in the same scope returns the same handle. `disconnect_session` removes one binding.\n"
