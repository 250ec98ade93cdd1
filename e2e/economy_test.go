package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// TestEconomy is the economy benchmark: what a model reads to do one task in
// the demo app. It measures bytes, not time, so it asserts the targets.
//
// A real headless Chromium runs the demo Taskboard (client/lapd.js) against a
// real `lapd serve` (default flags); mcp-go's client plays the model over
// /agent/mcp and over `lapd mcp`; the test plays the human, who clicks
// Approve in the panel. The task: add "Buy milk", "Walk dog" and "Write
// report", mark "Walk dog" done, then delete all tasks (clearAll, which needs
// the human's approval).
//
//	(a) a fresh page (3 demo tasks); the model follows lapd's own
//	    instructions and hints literally, with default options
//	(b) the same on a board that already holds 50 tasks
//
// Recorded per call and in total: calls, content-text bytes (what most
// clients hand the model), structuredContent bytes; and tools/list as a model
// API receives it (name + description + input schema per tool).
//
//	go test ./e2e -run TestEconomy -v
//
// LAPD_ECONOMY_DUMP=1 also logs every result text.
func TestEconomy(t *testing.T) {
	needTool(t, "chromium", browserChromium)
	srv := startServer(t, "", "--lap-rate", "600")
	type run struct {
		transport, script string
		ec                economy
	}
	var runs []run
	for _, transport := range []string{"http", "stdio"} {
		for _, script := range []string{"a", "b"} {
			t.Run(transport+"/"+script, func(t *testing.T) {
				ec := economyRun(t, srv, transport, script)
				runs = append(runs, run{transport, script, ec})
			})
		}
	}
	if t.Failed() || len(runs) != 4 {
		return
	}
	var tb strings.Builder
	tb.WriteString("| transport | script | calls | result text | structuredContent | tools/list (model view) |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, r := range runs {
		fmt.Fprintf(&tb, "| %s | %s | %d | %d B | %d B | %d B (%d tools) |\n", r.transport, r.script, len(r.ec.calls), r.ec.text(), r.ec.sc(), r.ec.toolsBytes, r.ec.tools)
	}
	for _, r := range runs {
		fmt.Fprintf(&tb, "\n%s/%s:\n", r.transport, r.script)
		for _, c := range r.ec.calls {
			fmt.Fprintf(&tb, "  %-18s %-34s text %5d B  sc %5d B\n", c.tool, c.what, c.text, c.sc)
		}
	}
	for _, r := range runs {
		fmt.Fprintf(&tb, "\n%s/%s: the same text with unquoted keys (JSON5 style) would be %d B (%.0f%% less)", r.transport, r.script, r.ec.terse(), 100-100*float64(r.ec.terse())/float64(r.ec.text()))
	}
	t.Logf("economy\n%s", tb.String())

	// Targets (issue 9).
	for _, r := range runs {
		if r.ec.toolsBytes > 7*1024 {
			t.Errorf("%s: tools/list is %d B as the model sees it, want ≤ 7 KiB", r.transport, r.ec.toolsBytes)
		}
		if r.script != "a" {
			continue
		}
		if n := len(r.ec.calls); n > 5 {
			t.Errorf("%s/a: %d calls, want ≤ 5", r.transport, n)
		}
		if b := r.ec.text(); b > 3584 {
			t.Errorf("%s/a: %d B of result text, want ≤ 3.5 KiB", r.transport, b)
		}
	}
	for i := 0; i+1 < len(runs); i += 2 {
		a, b := runs[i], runs[i+1]
		if float64(b.ec.text()) > 1.1*float64(a.ec.text()) {
			t.Errorf("%s: 50-task board read %d B, more than 110%% of the fresh board's %d B", a.transport, b.ec.text(), a.ec.text())
		}
	}
}

type economyCall struct {
	tool, what string
	text, sc   int
	terse      int // the text with unquoted keys (JSON5 style), for comparison
}

type economy struct {
	calls             []economyCall
	tools, toolsBytes int
}

func (e economy) text() (n int) {
	for _, c := range e.calls {
		n += c.text
	}
	return n
}

func (e economy) terse() (n int) {
	for _, c := range e.calls {
		n += c.terse
	}
	return n
}

// economyKeyRE finds object keys that are identifiers (a quote inside a
// string is escaped in compact JSON, so `{"` and `,"` only start keys).
var economyKeyRE = regexp.MustCompile(`([{,])"([A-Za-z_$][A-Za-z0-9_$]*)":`)

// economyTerse is a terser text form for comparison: JSON with unquoted keys.
func economyTerse(s string) string { return economyKeyRE.ReplaceAllString(s, "$1$2:") }

func (e economy) sc() (n int) {
	for _, c := range e.calls {
		n += c.sc
	}
	return n
}

// economyModel is the model side of one run: it calls tools and counts what
// it reads.
type economyModel struct {
	t    *testing.T
	mc   *mcpclient.Client
	ec   *economy
	dump bool
	// session is the handle connect_session returned; the model passes it
	// on every later call, as lapd's hint says.
	session any
}

func (m *economyModel) call(tool, what string, args map[string]any) browserToolResult {
	m.t.Helper()
	if m.session != nil {
		args["session"] = m.session
	}
	r := browserCall(m.t, m.mc, tool, args)
	m.ec.calls = append(m.ec.calls, economyCall{tool: tool, what: what, text: len(r.Text), sc: len(r.Raw), terse: len(economyTerse(r.Text))})
	if m.dump {
		m.t.Logf("%s %s →\n%s", tool, what, r.Text)
	}
	return r
}

// toolsList records tools/list as a model API receives it: for each tool its
// name, description and input schema (titles, annotations and output schemas
// stay with the client).
func (m *economyModel) toolsList() {
	m.t.Helper()
	lt, err := m.mc.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		m.t.Fatalf("tools/list: %v", err)
	}
	m.ec.tools = len(lt.Tools)
	for _, tool := range lt.Tools {
		schema := tool.RawInputSchema
		if len(schema) == 0 {
			schema, _ = json.Marshal(tool.InputSchema)
		}
		b, _ := json.Marshal(map[string]any{"name": tool.Name, "description": tool.Description, "input_schema": json.RawMessage(schema)})
		m.ec.toolsBytes += len(b)
	}
}

// economyRun opens a fresh page, prepares the board for script, and lets the
// model do the task over transport.
func economyRun(t *testing.T, srv *server, transport, script string) economy {
	tab := browserOpen(t, srv.URL+"/")
	tab.waitStatus("idle", 10*time.Second)
	if script == "b" {
		// The human fills the board to 50 tasks through the page's own form.
		tab.eval(`(() => { const f = document.querySelector('#add-form'), i = document.querySelector('#new-title');
			for (let n = 1; n <= 47; n++) { i.value = 'Earlier task ' + n; f.requestSubmit() } return true })()`, nil)
		tab.waitJS(`document.querySelectorAll('#board li.task').length === 50`, 5*time.Second)
	}
	tab.click(browserTestID("connect"))
	tab.waitStatus("pending-claude", 10*time.Second)
	line := tab.evalString(browserTestID("connect-line") + `.value`)

	var mc *mcpclient.Client
	if transport == "http" {
		mc = browserMCPHTTP(t, srv.URL)
	} else {
		mc = browserMCPStdio(t)
	}
	ec := &economy{}
	m := &economyModel{t: t, mc: mc, ec: ec, dump: os.Getenv("LAPD_ECONOMY_DUMP") == "1"}
	m.toolsList()
	economyScript(t, tab, m, line)

	// The board ends empty, as the task asks.
	tab.waitJS(`document.querySelectorAll('#board li.task').length === 0`, 5*time.Second)
	return *ec
}

var economyIDRE = regexp.MustCompile(`"id":(\d+)[^{}]*"title":"Walk dog"|"title":"Walk dog"[^{}]*"id":(\d+)`)

// economyScript is the model following lapd's instructions, server
// instructions and `next` hints literally, with default options.
func economyScript(t *testing.T, tab *browserTab, m *economyModel, line string) {
	// 1. The user pastes the connect line: connect_session with it. Its
	//    result is the first observation (no observe after it).
	r := m.call("connect_session", "line", map[string]any{"line": line})
	if r.IsError || r.SC["status"] != "connected" {
		t.Fatalf("connect_session: %s", r.Text)
	}
	m.session = r.SC["session"]
	// 2. Multi-step work: narrate first.
	m.call("narrate", "plan", map[string]any{"text": "Adding three tasks, ticking one, then clearing the board (needs your approval)."})
	// 3. One batch adds the three tasks.
	r = m.call("send_message", "msgs: 3× addTask", map[string]any{"msgs": []any{
		map[string]any{"type": "addTask", "title": "Buy milk"},
		map[string]any{"type": "addTask", "title": "Walk dog"},
		map[string]any{"type": "addTask", "title": "Write report"},
	}})
	if r.IsError || r.SC["status"] != "dispatched" {
		t.Fatalf("send_message batch: %s", r.Text)
	}
	// The model reads "Walk dog"'s id from the diff it was shown.
	mm := economyIDRE.FindStringSubmatch(r.Text)
	if mm == nil {
		t.Fatalf("no id for Walk dog in %s", r.Text)
	}
	id := mm[1] + mm[2]
	var idn int
	fmt.Sscan(id, &idn)
	r = m.call("send_message", "toggleDone", map[string]any{"msg": map[string]any{"type": "toggleDone", "id": idn}})
	if r.IsError || r.SC["status"] != "dispatched" {
		t.Fatalf("send_message toggleDone: %s", r.Text)
	}
	// 4. clearAll needs the human: send_message waits for the decision while
	//    the human clicks Approve in the panel.
	done := make(chan browserToolResult, 1)
	go func() {
		res, err := browserTryCall(m.mc, "send_message", map[string]any{"session": m.session, "msg": map[string]any{"type": "clearAll"}})
		if err != nil {
			res = browserToolResult{IsError: true, Text: err.Error()}
		}
		done <- res
	}()
	approve := browserPanel + `.querySelector('[data-testid^="approve-"]')`
	tab.waitJS(`!!`+approve, 10*time.Second)
	tab.click(approve)
	r = <-done
	m.ec.calls = append(m.ec.calls, economyCall{tool: "send_message", what: "clearAll (human approves)", text: len(r.Text), sc: len(r.Raw), terse: len(economyTerse(r.Text))})
	if m.dump {
		t.Logf("send_message clearAll →\n%s", r.Text)
	}
	if r.IsError || r.SC["status"] != "confirmed" {
		t.Fatalf("send_message clearAll: %s", r.Text)
	}
}
