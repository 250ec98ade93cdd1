package mcp

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lap"
)

// dispatched is a /message body: a diff and the action list.
func dispatched(diff string, actions string) json.RawMessage {
	return json.RawMessage(`{"status":"dispatched","stateDiff":` + diff + `,"actions":` + actions + `,"drain":{"effectsObserved":1,"durationMs":3,"timedOut":false,"errors":[]}}`)
}

const twoActions = `[{"variant":"addTodo","intent":"Add","requiresConfirm":false,"source":"schema","emits":[]},{"variant":"clearAll","intent":"Clear","requiresConfirm":true}]`

func observeWith(actions string) func(int, fakeCall) (any, error) {
	return func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":{"todos":[]},"actions":` + actions + `,"description":{"name":"Todo","version":"1","schemaHash":"h1"},"context":null,"health":{"connected":true}}`), nil
	}
}

// The action list is sent again only when it changed since the model was
// shown it, per binding; observe and verbose always show it whole.
func TestActionsOnlyWhenChanged(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.lap.on("/observe", observeWith(twoActions))
	a := h.connect(tokA)
	b := h.connect(tokB)
	unavailable := `[{"variant":"addTodo","intent":"Add"},{"variant":"clearAll","intent":"Clear","requiresConfirm":true,"available":false,"unavailableReason":"nothing to clear"}]`
	actions := twoActions
	h.lap.on("/message", func(int, fakeCall) (any, error) {
		return dispatched(`[{"op":"add","path":"/todos/0","value":"x"}]`, actions), nil
	})
	send := func(session string, extra map[string]any) toolOut {
		t.Helper()
		a := map[string]any{"session": session, "msg": map[string]any{"type": "addTodo"}}
		for k, v := range extra {
			a[k] = v
		}
		out := h.call("send_message", a)
		if out.IsError || out.SC["status"] != "dispatched" {
			t.Fatalf("send_message: %s", out.Text)
		}
		return out
	}
	// unchanged: nothing about actions, no drain, no key
	out := send(a, nil)
	if out.Text != `{"status":"dispatched","stateDiff":[{"op":"add","path":"/todos/0","value":"x"}]}` {
		t.Fatalf("unchanged actions: %s", out.Text)
	}
	// changed: a merge patch of the changed entry only, once
	actions = unavailable
	out = send(a, nil)
	if got := mcpJSON(out.SC["actionsChanged"]); got != `[{"unavailable":"nothing to clear","variant":"clearAll"}]` || out.SC["actions"] != nil {
		t.Fatalf("changed actions: %s", out.Text)
	}
	if out = send(a, nil); out.SC["actionsChanged"] != nil {
		t.Fatalf("the same change was sent twice: %s", out.Text)
	}
	// binding b was shown the old list: it gets the change too
	if out = send(b, nil); out.SC["actionsChanged"] == nil {
		t.Fatalf("binding b missed the change: %s", out.Text)
	}
	// verbose: the LAP body, whole list, key and drain included
	if out = send(a, map[string]any{"verbose": true}); out.SC["actions"] == nil || out.SC["drain"] == nil || out.SC["idempotencyKey"] == nil {
		t.Fatalf("verbose: %s", out.Text)
	}
	// observe: the whole picture, even when nothing changed
	h.lap.on("/observe", observeWith(unavailable))
	if o := h.call("observe", map[string]any{"session": a}); len(o.SC["actions"].([]any)) != 2 || o.SC["health"] != nil {
		t.Fatalf("observe: %s", o.Text)
	}
}

func mcpJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// A batch: in order, one LAP call and one idempotency key per message, one
// combined diff, a status per message; it stops at the first message that
// is not dispatched.
func TestBatch(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.lap.on("/observe", observeWith(twoActions))
	h.connect(tokA)
	h.lap.on("/message", func(n int, c fakeCall) (any, error) {
		title, _ := c.Body["msg"].(map[string]any)["title"].(string)
		if title == "bad" {
			return map[string]any{"status": "rejected", "reason": "schema-error", "errors": []any{map[string]any{"path": "/title", "message": "too short"}}}, nil
		}
		return dispatched(fmt.Sprintf(`[{"op":"add","path":"/todos/%d","value":%q},{"op":"replace","path":"/n","value":%d}]`, n-1, title, n), twoActions), nil
	})
	msg := func(title string) map[string]any { return map[string]any{"type": "addTodo", "title": title} }
	out := h.call("send_message", map[string]any{"msgs": []any{msg("a"), msg("b"), msg("c")}, "idempotencyKey": "k", "reason": "asked"})
	want := `{"status":"dispatched",` + // (no results: every message was dispatched, nothing to add)
		`"stateDiff":[{"op":"add","path":"/todos/0","value":"a"},{"op":"add","path":"/todos/1","value":"b"},{"op":"add","path":"/todos/2","value":"c"},{"op":"replace","path":"/n","value":3}]}`
	if out.IsError || out.Text != want {
		t.Fatalf("batch:\n got %s\nwant %s", out.Text, want)
	}
	calls := h.lap.callsTo("/message")
	var ks []string
	for i, c := range calls {
		ks = append(ks, c.Body["idempotencyKey"].(string))
		if c.Body["reason"] != "asked" || c.Body["msg"].(map[string]any)["title"] != string(rune('a'+i)) {
			t.Fatalf("call %d body %v", i, c.Body)
		}
	}
	if !slices.Equal(ks, []string{"k#1", "k#2", "k#3"}) {
		t.Fatalf("keys %v", ks)
	}

	// Stops at the first that is not dispatched; the refusal is a result.
	out = h.call("send_message", map[string]any{"msgs": []any{msg("d"), msg("bad"), msg("e")}})
	if out.IsError || out.SC["status"] != "rejected" || mcpJSON(out.SC["results"]) != `[{"status":"dispatched"},{"errors":[{"message":"too short","path":"/title"}],"reason":"schema-error","status":"rejected"},{"status":"not-sent"}]` ||
		!strings.Contains(mcpStr(out.SC["next"]), "the 1 after it were not sent") || len(out.SC["stateDiff"].([]any)) != 2 {
		t.Fatalf("stopped batch: %s", out.Text)
	}
	if n := len(h.lap.callsTo("/message")); n != 5 {
		t.Fatalf("%d /message calls, want 5 (the message after the refusal is not sent)", n)
	}
}

// A batch whose message 2 of 3 fails (lapd unreachable): an isError result
// that says what was dispatched, with the key to repeat the call safely.
func TestBatchFailureMidway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	h.lap.on("/message", func(n int, c fakeCall) (any, error) {
		if n == 2 {
			return nil, &lap.Error{Code: "network", Detail: "connection refused"}
		}
		return dispatched(`[{"op":"replace","path":"/n","value":1}]`, twoActions), nil
	})
	m := map[string]any{"type": "addTodo"}
	out := h.call("send_message", map[string]any{"msgs": []any{m, m, m}})
	wantError(t, out, CodeNetwork, "Message 2 of 3 failed", "same idempotencyKey")
	if mcpJSON(out.SC["results"]) != `[{"status":"dispatched"},{"status":"failed"},{"status":"not-sent"}]` || out.SC["stateDiff"] == nil ||
		!strings.HasPrefix(mcpStr(out.SC["idempotencyKey"]), "mcp_") {
		t.Fatalf("failure midway: %s", mcpJSON(out.SC))
	}
}

// A confirmed message inside a batch: its stateAfter, then the diffs of
// the messages after it.
func TestBatchConfirmedMidway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	h.lap.on("/message", func(n int, c fakeCall) (any, error) {
		switch c.Body["msg"].(map[string]any)["type"] {
		case "clearAll":
			if c.Body["approvalTimeoutMs"] != 1500.0 {
				t.Errorf("approvalTimeoutMs %v", c.Body["approvalTimeoutMs"])
			}
			return map[string]any{"status": "confirmed", "stateAfter": map[string]any{"todos": []any{}, "n": 7}}, nil
		}
		return dispatched(`[{"op":"replace","path":"/n","value":`+fmt.Sprint(n)+`}]`, twoActions), nil
	})
	out := h.call("send_message", map[string]any{"approvalTimeoutMs": 1500, "msgs": []any{
		map[string]any{"type": "addTodo"}, map[string]any{"type": "clearAll"}, map[string]any{"type": "addTodo"}}})
	if out.IsError || out.SC["status"] != "dispatched" || mcpJSON(out.SC["stateAfter"]) != `{"n":7,"todos":[]}` ||
		mcpJSON(out.SC["stateDiff"]) != `[{"op":"replace","path":"/n","value":3}]` || !strings.Contains(mcpStr(out.SC["next"]), "right after the approved action") {
		t.Fatalf("confirmed midway: %s", out.Text)
	}
}

func TestSendMessageArguments(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	m := map[string]any{"type": "a"}
	many := make([]any, MaxBatch+1)
	for i := range many {
		many[i] = m
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{}, "pass msg (one action) or msgs"},
		{map[string]any{"msg": m, "msgs": []any{m}}, "not both"},
		{map[string]any{"msgs": []any{}}, "1 to 20"},
		{map[string]any{"msgs": many}, "1 to 20"},
		{map[string]any{"msgs": []any{m, map[string]any{"title": "x"}}}, "msgs[1].type"},
		{map[string]any{"msgs": []any{m, "a"}}, "msgs[1] must be an object"},
		{map[string]any{"msgs": []any{m, m}, "idempotencyKey": strings.Repeat("k", 199)}, "leave room for #2"},
		{map[string]any{"msg": m, "approvalTimeoutMs": -1}, "at least 0"},
	} {
		wantError(t, h.call("send_message", tc.args), CodeInvalidArguments, tc.want)
	}
	if n := len(h.lap.callsTo("/message")); n != 0 {
		t.Fatalf("%d messages sent on bad arguments", n)
	}
}

// State the model did not ask for is kept under the budget; observe
// returns all of it.
func TestStateBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	big := `[` + strings.Repeat(`{"id":1,"title":"a task"},`, 99) + `{"id":1,"title":"a task"}]`
	h.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":{"tasks":` + big + `,"nextId":101},"actions":[],"description":{"name":"T"},"context":{"summary":"100 tasks","hints":[]},"health":{"connected":true,"visible":false}}`), nil
	})
	out := h.call("connect_session", map[string]any{"url": base, "token": tokA})
	if mcpJSON(out.SC["state"]) != `{"nextId":101}` || mcpJSON(out.SC["stateOmitted"]) != `{"/tasks":"100 items, 2.5 KB"}` ||
		!strings.Contains(mcpStr(out.SC["next"]), "get_state") || mcpJSON(out.SC["context"]) != `{"summary":"100 tasks"}` || out.SC["health"] == nil {
		t.Fatalf("connect: %s", out.Text)
	}
	if o := h.call("observe", nil); o.SC["stateOmitted"] != nil || len(mcpPathAny(o.SC, "state", "tasks").([]any)) != 100 {
		t.Fatalf("observe: %s", o.Text)
	}
}

func mcpPathAny(v any, ks ...string) any {
	for _, k := range ks {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

func TestParseToolSet(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]ToolSet{"": ToolsCore, "core": ToolsCore, "ALL": ToolsAll, " all ": ToolsAll} {
		if got, err := ParseToolSet(in); err != nil || got != want {
			t.Errorf("ParseToolSet(%q) = %v %v", in, got, err)
		}
	}
	if _, err := ParseToolSet("some"); err == nil {
		t.Error("ParseToolSet(some) accepted")
	}
}

// send_message's budget includes the time a human may take to approve; a
// rate limit is still only waited out within timeoutMs + slack.
func TestSendMessageRetriesWithinDrainBudget(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	h.lap.on("/message", func(int, fakeCall) (any, error) {
		return nil, &lap.Error{Status: 429, Code: "rate-limited", RetryAfter: 10 * time.Second}
	})
	out := h.call("send_message", map[string]any{"msg": map[string]any{"type": "a"}, "timeoutMs": 1000})
	wantError(t, out, "rate-limited", "wait 10 s")
	if w := h.after.got(); len(w) != 0 {
		t.Fatalf("waited %v for a rate limit longer than the drain budget", w)
	}
	if out.SC["idempotencyKey"] == nil {
		t.Fatalf("no key to retry with: %s", mcpJSON(out.SC))
	}
}

// The rendered action list is reused while the app sends the same bytes,
// and redone when its message schemas change (the payload signatures with
// them) even if the list itself did not.
func TestRenderCacheFollowsMessages(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	msgs := `{"variants":{"addTodo":{"title":"string"}}}`
	h.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":{},"actions":[{"variant":"addTodo"}],"description":{"name":"T","messages":` + msgs + `}}`), nil
	})
	h.connect(tokA)
	for i, want := range []string{"{title: string}", "{title: string}", "{title: string, n?: number}"} {
		if i == 2 {
			msgs = `{"variants":{"addTodo":{"title":"string","n":{"type":"number","optional":true}}}}`
		}
		o := h.call("observe", nil)
		if got := mcpPathAny(o.SC["actions"].([]any)[0], "payload"); got != want {
			t.Fatalf("observe %d: payload %v, want %q", i, got, want)
		}
	}
}

// A handler that threw: the result keeps the error's message (not its JS
// stack) and says what to do.
func TestDrainErrorsLean(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.lap.on("/observe", observeWith(twoActions))
	h.connect(tokA)
	stack := "Error: no task with id 999\n    at toggle (http://127.0.0.1:8787/demo/app.js:120:11)\n    at dispatch (http://127.0.0.1:8787/agent/client.js:1550:19)"
	h.lap.on("/message", func(int, fakeCall) (any, error) {
		body, _ := json.Marshal(map[string]any{"status": "dispatched", "stateDiff": []any{}, "actions": json.RawMessage(twoActions),
			"drain": map[string]any{"effectsObserved": 0, "durationMs": 1, "timedOut": false,
				"errors": []any{map[string]any{"kind": "error", "message": "no task with id 999", "stack": stack}}}})
		return json.RawMessage(body), nil
	})
	out := h.call("send_message", map[string]any{"msg": map[string]any{"type": "addTodo"}})
	if out.IsError || out.SC["status"] != "dispatched" {
		t.Fatalf("send_message: %s", out.Text)
	}
	if strings.Contains(out.Text, "app.js") || !strings.Contains(out.Text, `"message":"no task with id 999"`) {
		t.Fatalf("want the error's message without its stack: %s", out.Text)
	}
	if !strings.Contains(mcpStr(out.SC["next"]), "drain.errors") {
		t.Fatalf("want a next that names the error: %s", out.Text)
	}
}
