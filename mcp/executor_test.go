package mcp

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lap"
)

func TestConnectAndObserve(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	out := h.call("connect_session", map[string]any{"line": `Call connect_session with url="` + base + `" and token="` + tokA + `".`})
	if out.IsError {
		t.Fatal(out.Text)
	}
	s, _ := out.SC["session"].(string)
	if !strings.HasPrefix(s, "s_") || len(s) != 18 {
		t.Fatalf("session handle %q", s)
	}
	// Lean: health only when something is wrong, no description block.
	if out.SC["status"] != "connected" || out.SC["appName"] != "Todo" || out.SC["appVersion"] != "1.0" || out.SC["state"] == nil ||
		out.SC["actions"] == nil || out.SC["health"] != nil || out.SC["description"] != nil || !strings.Contains(out.SC["next"].(string), s) {
		t.Fatalf("connect result %v", out.SC)
	}
	// verbose: the LAP body as it came.
	if v := h.call("connect_session", map[string]any{"url": base, "token": tokA, "verbose": true}); v.SC["health"] == nil || v.SC["description"] == nil || v.SC["session"] != s {
		t.Fatalf("verbose connect %v", v.SC)
	}
	c := h.lap.callsTo("/observe")[0]
	if c.Base != base || c.Token != tokA {
		t.Fatalf("observe went to %q", c.Base)
	}
	if strings.Contains(out.Text, tokA) {
		t.Fatal("token leaked into the result")
	}
	// Same line again: same handle (idempotent).
	if again := h.connect(tokA); again != s {
		t.Fatalf("reconnect gave %s, want %s", again, s)
	}

	obs := h.call("observe", nil)
	if obs.IsError || obs.SC["schemaChanged"] != nil {
		t.Fatalf("observe: %v", obs)
	}
	h.lap.on("/observe", func(int, fakeCall) (any, error) { return observeBody("Todo", "h2"), nil })
	obs = h.call("observe", nil)
	if obs.SC["schemaChanged"] != true || obs.SC["schemaChangedNote"] == nil {
		t.Fatalf("schema change not flagged: %v", obs.SC)
	}
	if obs = h.call("observe", nil); obs.SC["schemaChanged"] != nil {
		t.Fatal("schemaChanged repeated")
	}
}

func TestEveryToolForwards(t *testing.T) {
	t.Parallel()
	tests := []struct {
		tool  string
		args  map[string]any
		route string
		body  map[string]any // expected LAP body (idempotencyKey checked separately)
	}{
		{"describe_app", nil, "/describe", nil},
		{"get_state", map[string]any{"path": "/todos"}, "/state", map[string]any{"path": "/todos"}},
		{"query_state", map[string]any{"path": "/filter"}, "/query-state", map[string]any{"path": "/filter"}},
		{"describe_recent_actions", map[string]any{"n": 3, "kind": "dispatch"}, "/recent-actions", map[string]any{"n": 3.0, "kind": "dispatch"}},
		{"would_dispatch", map[string]any{"msg": map[string]any{"type": "addTodo", "title": "x"}}, "/would-dispatch", map[string]any{"msg": map[string]any{"type": "addTodo", "title": "x"}}},
		{"list_actions", nil, "/actions", nil},
		{"send_message", map[string]any{"msg": map[string]any{"type": "addTodo"}, "reason": "asked", "waitFor": "idle", "timeoutMs": 1000}, "/message", map[string]any{"msg": map[string]any{"type": "addTodo"}, "reason": "asked", "waitFor": "idle", "timeoutMs": 1000.0, "approvalTimeoutMs": 20000.0}},
		{"get_confirm_result", map[string]any{"confirmId": "c1"}, "/confirm-result", map[string]any{"confirmId": "c1", "timeoutMs": 20000.0}},
		{"wait_for_change", map[string]any{"path": "/todos", "timeoutMs": 50}, "/wait", map[string]any{"path": "/todos", "timeoutMs": 50.0}},
		{"narrate", map[string]any{"text": "Adding a todo"}, "/narrate", map[string]any{"text": "Adding a todo"}},
		{"query_dom", map[string]any{"name": "row", "multiple": true}, "/query-dom", map[string]any{"name": "row", "multiple": true}},
		{"describe_visible_content", nil, "/describe-visible", nil},
		{"describe_context", nil, "/context", nil},
	}
	h := newHarness(t, nil)
	h.connect(tokA)
	for _, tc := range tests {
		h.lap.on(tc.route, func(int, fakeCall) (any, error) {
			return map[string]any{"route": tc.route, "status": "dispatched"}, nil
		})
		out := h.call(tc.tool, tc.args)
		if out.IsError || out.SC["route"] != tc.route {
			t.Fatalf("%s: %v %q", tc.tool, out.SC, out.Text)
		}
		var text map[string]any
		if err := json.Unmarshal([]byte(out.Text), &text); err != nil || text["route"] != tc.route {
			t.Fatalf("%s: text copy %q", tc.tool, out.Text)
		}
		calls := h.lap.callsTo(tc.route)
		got := calls[len(calls)-1].Body
		if tc.tool == "send_message" {
			// generated, and not echoed on success (only on failures and with verbose)
			if k, _ := got["idempotencyKey"].(string); !strings.HasPrefix(k, "mcp_") || out.SC["idempotencyKey"] != nil {
				t.Fatalf("idempotencyKey %v / %v", got["idempotencyKey"], out.SC["idempotencyKey"])
			}
			delete(got, "idempotencyKey")
		}
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(tc.body)
		if string(gb) != string(wb) {
			t.Fatalf("%s: body %s, want %s", tc.tool, gb, wb)
		}
	}
	if out := h.call("disconnect_session", nil); out.SC["status"] != "disconnected" {
		t.Fatalf("disconnect: %v", out.SC)
	}
	wantError(t, h.call("observe", nil), CodeUnbound, "connect_session")
	if out := h.call("disconnect_session", nil); out.IsError || out.SC["status"] != "not-connected" {
		t.Fatalf("second disconnect: %v", out)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		code string
		hint string
	}{
		{"auth", &lap.Error{Status: 401, Code: "auth-failed"}, "auth-failed", "new connect line"},
		{"revoked", &lap.Error{Status: 403, Code: "revoked"}, "revoked", "revoked"},
		{"paused-expired", &lap.Error{Status: 503, Code: "paused", Reconnect: "expired"}, "paused", "expired"},
		{"paused-too-long", &lap.Error{Status: 503, Code: "paused", Reconnect: "pending", RetryAfter: time.Minute}, "paused", "retry in 60 s"},
		{"rate-too-long", &lap.Error{Status: 429, Code: "rate-limited", RetryAfter: time.Minute}, "rate-limited", "wait 60 s"},
		{"unavailable-too-long", &lap.Error{Status: 503, Code: lap.CodeUnavailable, RetryAfter: time.Minute}, lap.CodeUnavailable, "retry in 60 s"},
		{"timeout", &lap.Error{Status: 504, Code: "timeout"}, "timeout", "observe"},
		{"outcome-unknown", &lap.Error{Status: 409, Code: "outcome-unknown"}, "outcome-unknown", "call observe to see whether it took effect"},
		{"conflict", &lap.Error{Status: 409, Code: "conflict"}, "conflict", "answer it in the app"},
		{"invalid", &lap.Error{Status: 400, Code: "invalid", Detail: "text required"}, "invalid", "text required"},
		{"network", &lap.Error{Code: "network", Detail: "connection refused"}, "network", "lapd at " + base},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			h.connect(tokA)
			h.lap.on("/state", func(int, fakeCall) (any, error) { return nil, tc.err })
			wantError(t, h.call("get_state", nil), tc.code, tc.hint)
		})
	}
	// LAP's detail on paused/revoked repeats the hint in words (for bridges
	// that show only code and detail); the model reads it once.
	for _, le := range []*lap.Error{
		{Status: 403, Code: "revoked", Detail: "lap detail: revoked in the app"},
		{Status: 503, Code: "paused", Reconnect: "pending", RetryAfter: time.Minute, Detail: "lap detail: may reconnect within 60 s"},
	} {
		h := newHarness(t, nil)
		h.connect(tokA)
		h.lap.on("/state", func(int, fakeCall) (any, error) { return nil, le })
		out := h.call("get_state", nil)
		wantError(t, out, le.Code)
		if strings.Contains(out.Text, le.Detail) {
			t.Errorf("%s: the LAP detail is repeated after the hint: %q", le.Code, out.Text)
		}
	}
}

func TestConnectFailureUnbinds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.lap.on("/observe", func(int, fakeCall) (any, error) { return nil, &lap.Error{Status: 401, Code: "auth-failed"} })
	wantError(t, h.call("connect_session", map[string]any{"url": base, "token": tokA}), "auth-failed")
	if n := h.exec.Bindings().Len(); n != 0 {
		t.Fatalf("%d bindings left after failed connect", n)
	}
	wantError(t, h.call("connect_session", map[string]any{"line": "hello"}), CodeInvalidArguments, "connect line")
	wantError(t, h.call("connect_session", map[string]any{"token": tokA}), CodeInvalidArguments, "URL")
	wantError(t, h.call("connect_session", map[string]any{"url": "ftp://x", "token": tokA}), CodeInvalidArguments)
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"query_state", nil, "path is required"},
		{"get_state", map[string]any{"path": 3}, "path must be a string"},
		{"observe", map[string]any{"bogus": 1}, "unknown argument(s) bogus"},
		{"send_message", map[string]any{"msg": map[string]any{"title": "x"}}, "msg.type"},
		{"send_message", map[string]any{"msg": map[string]any{"type": "a"}, "waitFor": "later"}, "waitFor must be one of"},
		{"send_message", map[string]any{"msg": map[string]any{"type": "a"}, "timeoutMs": 1e9}, "at most"},
		{"describe_recent_actions", map[string]any{"n": 1.5}, "integer"},
		{"narrate", map[string]any{"text": strings.Repeat("x", 3000)}, "longer than"},
	} {
		wantError(t, h.call(tc.tool, tc.args), CodeInvalidArguments, tc.want)
	}
}

func TestPausedThenRecovered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	h.lap.on("/message", func(n int, c fakeCall) (any, error) {
		if n < 3 {
			return nil, &lap.Error{Status: 503, Code: "paused", Reconnect: "pending", RetryAfter: 2 * time.Second}
		}
		return map[string]any{"status": "dispatched", "stateDiff": []any{}}, nil
	})
	out := h.call("send_message", map[string]any{"msg": map[string]any{"type": "addTodo"}, "timeoutMs": 5000})
	if out.IsError || out.SC["status"] != "dispatched" {
		t.Fatalf("%v", out)
	}
	if w := h.after.got(); !slices.Equal(w, []time.Duration{2 * time.Second, 2 * time.Second}) {
		t.Fatalf("waits %v", w)
	}
	calls := h.lap.callsTo("/message")
	k := calls[0].Body["idempotencyKey"]
	for _, c := range calls {
		if c.Body["idempotencyKey"] != k {
			t.Fatalf("idempotencyKey changed across retries: %v vs %v", c.Body["idempotencyKey"], k)
		}
	}
	// A key the model gave is kept.
	h.call("send_message", map[string]any{"msg": map[string]any{"type": "addTodo"}, "idempotencyKey": "mine"})
	calls = h.lap.callsTo("/message")
	if calls[len(calls)-1].Body["idempotencyKey"] != "mine" {
		t.Fatal("model's idempotencyKey not forwarded")
	}
}

func TestRateLimitedWaits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	h.lap.on("/actions", func(n int, c fakeCall) (any, error) {
		if n == 1 {
			return nil, &lap.Error{Status: 429, Code: "rate-limited", RetryAfter: 1500 * time.Millisecond}
		}
		return map[string]any{"actions": []any{}}, nil
	})
	if out := h.call("list_actions", nil); out.IsError {
		t.Fatal(out.Text)
	}
	if w := h.after.got(); len(w) != 1 || w[0] != 1500*time.Millisecond {
		t.Fatalf("waits %v", w)
	}
}

// A token store that did not answer (a cluster electing a leader) is
// waited out like a rate limit: retried after Retry-After.
func TestUnavailableWaits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	h.lap.on("/actions", func(n int, c fakeCall) (any, error) {
		if n == 1 {
			return nil, &lap.Error{Status: 503, Code: lap.CodeUnavailable, RetryAfter: 2 * time.Second}
		}
		return map[string]any{"actions": []any{}}, nil
	})
	if out := h.call("list_actions", nil); out.IsError {
		t.Fatal(out.Text)
	}
	if w := h.after.got(); len(w) != 1 || w[0] != 2*time.Second {
		t.Fatalf("waits %v", w)
	}
}

func TestRetriesAreBounded(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxRetries = 3 })
	h.connect(tokA)
	h.lap.on("/actions", func(int, fakeCall) (any, error) {
		return nil, &lap.Error{Status: 503, Code: "paused", Reconnect: "pending", RetryAfter: time.Second}
	})
	wantError(t, h.call("list_actions", nil), "paused", "retry in 1 s")
	if n := len(h.lap.callsTo("/actions")); n != 4 {
		t.Fatalf("%d attempts, want 4", n)
	}
}

// Refusals by the app, its policy or the user are results (isError false)
// with a status, a reason and what to do, so a client reading
// structuredContent sees one shape.
func TestDispatchOutcomes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		reply  map[string]any
		status string
		keep   string // a LAP field that must be kept
		hint   string
	}{
		{"human-only", map[string]any{"status": "rejected", "reason": "human-only", "detail": "reset is for humans"}, "rejected", "detail", "ask them"},
		{"schema-error", map[string]any{"status": "rejected", "reason": "schema-error", "errors": []any{map[string]any{"path": "/title", "message": "required"}}}, "rejected", "errors", "errors say"},
		{"invalid", map[string]any{"status": "rejected", "reason": "invalid", "detail": "unknown variant: x"}, "rejected", "detail", "action list"},
		{"pending", map[string]any{"status": "pending-confirmation", "confirmId": "c9"}, "pending-confirmation", "confirmId", `confirmId="c9"`},
		{"confirmed", map[string]any{"status": "confirmed", "stateAfter": map[string]any{"n": 1}}, "confirmed", "stateAfter", "stateAfter is the current state"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			h.connect(tokA)
			h.lap.on("/message", func(int, fakeCall) (any, error) { return tc.reply, nil })
			out := h.call("send_message", map[string]any{"msg": map[string]any{"type": "x"}})
			if out.IsError || out.SC["status"] != tc.status || out.SC[tc.keep] == nil || !strings.Contains(out.SC["next"].(string), tc.hint) {
				t.Fatalf("%+v", out)
			}
			if r, ok := tc.reply["reason"]; ok && out.SC["reason"] != r {
				t.Fatalf("reason not kept: %v", out.SC)
			}
			if out.SC["idempotencyKey"] != nil {
				t.Fatalf("a refusal is an answer: no key to retry with: %v", out.SC)
			}
		})
	}
}

func TestConfirmResult(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reply map[string]any
		want  string
		hint  string
	}{
		{map[string]any{"status": "confirmed", "stateAfter": map[string]any{"n": 1}}, "confirmed", "current state"},
		{map[string]any{"status": "still-pending"}, "still-pending", "call get_confirm_result again"},
		{map[string]any{"status": "rejected", "reason": "user-cancelled"}, "rejected", "do not retry"},
	} {
		h := newHarness(t, nil)
		h.connect(tokA)
		h.lap.on("/confirm-result", func(int, fakeCall) (any, error) { return tc.reply, nil })
		out := h.call("get_confirm_result", map[string]any{"confirmId": "c1"})
		if out.IsError || out.SC["status"] != tc.want || !strings.Contains(mcpStr(out.SC["next"]), tc.hint) {
			t.Fatalf("%v", out)
		}
	}
}

func mcpStr(v any) string { s, _ := v.(string); return s }

func TestTwoSessions(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	a := h.connect(tokA)
	h.lap.on("/observe", func(int, fakeCall) (any, error) { return observeBody("Notes", "n1"), nil })
	b := h.connect(tokB)
	if a == b {
		t.Fatal("same handle for two tokens")
	}
	out := h.call("list_actions", nil)
	wantError(t, out, CodeSessionRequired, a+" (Todo)", b+" (Notes)")
	if ss, _ := out.SC["sessions"].([]any); len(ss) != 2 {
		t.Fatalf("sessions list %v", out.SC)
	}
	h.call("list_actions", map[string]any{"session": b})
	calls := h.lap.callsTo("/actions")
	if calls[len(calls)-1].Token != tokB {
		t.Fatal("session b did not use token b")
	}
	wantError(t, h.call("list_actions", map[string]any{"session": "s_nope"}), CodeUnknownSession)
	h.call("disconnect_session", map[string]any{"session": a})
	if out := h.call("list_actions", nil); out.IsError {
		t.Fatalf("one binding left should be the default: %s", out.Text)
	}
}

func TestProgressNotifications(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.ProgressInterval = 5 * time.Millisecond })
	h.connect(tokA)
	var mu sync.Mutex
	var msgs []string
	got := make(chan struct{})
	h.c.OnNotification(func(n mcpgo.JSONRPCNotification) {
		if n.Method != "notifications/progress" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		m, _ := n.Params.AdditionalFields["message"].(string)
		msgs = append(msgs, m)
		if len(msgs) == 3 {
			close(got)
		}
	})
	release := make(chan struct{})
	h.lap.on("/wait", func(int, fakeCall) (any, error) {
		<-release
		return map[string]any{"status": "changed", "stateAfter": map[string]any{}}, nil
	})
	done := make(chan toolOut)
	go func() {
		done <- callOn(t, h.c, "wait_for_change", map[string]any{}, &mcpgo.Meta{ProgressToken: "p1"})
	}()
	<-got // the first at once, then the ticker
	close(release)
	if out := <-done; out.IsError {
		t.Fatal(out.Text)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(msgs[0], "waiting for a change") {
		t.Fatalf("progress messages %q", msgs)
	}
}

func TestNoProgressWithoutToken(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	var n int
	var mu sync.Mutex
	h.c.OnNotification(func(mcpgo.JSONRPCNotification) { mu.Lock(); n++; mu.Unlock() })
	h.call("wait_for_change", nil)
	mu.Lock()
	defer mu.Unlock()
	if n != 0 {
		t.Fatalf("%d notifications without a progress token", n)
	}
}

func TestBudgetTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.Budgets.Read = 20 * time.Millisecond })
	h.connect(tokA)
	h.lap.on("/context", func(int, fakeCall) (any, error) {
		return nil, &lap.Error{Code: "network", Detail: "context deadline exceeded"}
	})
	// The fake answers at once, so emulate the budget expiring with a blocking route.
	block := make(chan struct{})
	defer close(block)
	h.lap.on("/context", nil)
	bl := &blockingLAP{fakeLAP: h.lap, route: "/context", block: block}
	h.exec.client = bl
	wantError(t, h.call("describe_context", nil), CodeNetwork, "budget")
}

type blockingLAP struct {
	*fakeLAP
	route string
	block chan struct{}
}

func (b *blockingLAP) Call(ctx context.Context, base, token, route string, body any) (json.RawMessage, error) {
	if route == b.route {
		select {
		case <-ctx.Done():
			return nil, &lap.Error{Code: "network", Detail: ctx.Err().Error()}
		case <-b.block:
		}
	}
	return b.fakeLAP.Call(ctx, base, token, route, body)
}

func TestConnectPrompt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	req := mcpgo.GetPromptRequest{}
	req.Params.Name = "connect"
	req.Params.Arguments = map[string]string{"line": "connect " + base + " " + tokA}
	res, err := h.c.GetPrompt(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	tc, ok := mcpgo.AsTextContent(res.Messages[0].Content)
	if !ok || res.Messages[0].Role != mcpgo.RoleUser || !strings.Contains(tc.Text, "connect_session") || !strings.Contains(tc.Text, tokA) {
		t.Fatalf("prompt %+v", res.Messages)
	}
}

func TestToolListOrderAndAnnotations(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	res, err := h.c.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		a := tl.Annotations
		if a.ReadOnlyHint == nil || a.DestructiveHint == nil || a.IdempotentHint == nil || a.OpenWorldHint == nil || tl.Title == "" {
			t.Fatalf("%s: annotations not all set", tl.Name)
		}
		if tl.RawOutputSchema == nil && tl.OutputSchema.Type == "" {
			t.Fatalf("%s: no output schema", tl.Name)
		}
	}
	want := []string{"connect_session", "disconnect_session", "observe", "describe_app", "get_state", "query_state", "describe_recent_actions",
		"would_dispatch", "list_actions", "send_message", "get_confirm_result", "wait_for_change", "narrate", "query_dom", "describe_visible_content", "describe_context"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v", names)
	}
	// The default set is the core, in the same order.
	core := newHarness(t, func(c *Config) { c.Tools = ToolsCore })
	res, err = core.c.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	if want := []string{"connect_session", "observe", "send_message", "get_confirm_result", "wait_for_change", "narrate"}; !slices.Equal(names, want) {
		t.Fatalf("core tools %v", names)
	}
}

// mcp-go logs every request and tool call at Info; lapd hands those lines
// down to Debug, so the default level writes nothing per call.
func TestMCPGoLogsAtDebug(t *testing.T) {
	t.Parallel()
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var buf syncBuf
		h := newHarness(t, func(c *Config) {
			c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
		})
		h.connect(tokA)
		buf.reset()
		h.call("observe", nil)
		got := buf.String()
		if level == slog.LevelInfo && got != "" {
			t.Fatalf("at Info an observe logged:\n%s", got)
		}
		if level == slog.LevelDebug && !strings.Contains(got, "observe") {
			t.Fatalf("at Debug mcp-go's request log is missing:\n%s", got)
		}
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
func (s *syncBuf) reset()         { s.mu.Lock(); defer s.mu.Unlock(); s.b.Reset() }

// A drop mid-call answers paused with the grace window's remainder as
// Retry-After (up to a minute); the tab is usually back within seconds, so
// the executor polls every 2 s within the call's budget instead of giving
// up with "retry in 60 s".
func TestPausedLongRetryAfterPolls(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	paused := 2
	h.lap.on("/observe", func(n int, c fakeCall) (any, error) {
		if paused > 0 {
			paused--
			return nil, &lap.Error{Status: 503, Code: "paused", Reconnect: "pending", RetryAfter: 58 * time.Second}
		}
		return map[string]any{"state": map[string]any{}, "actions": []any{}}, nil
	})
	if out := h.call("observe", nil); out.IsError {
		t.Fatalf("observe after the tab came back: %v", out)
	}
	if w := h.after.got(); !slices.Equal(w, []time.Duration{pausedPoll, pausedPoll}) {
		t.Fatalf("waits %v, want two of %v", w, pausedPoll)
	}
}

// An invalid request's LAP detail is the sentence the model reads, once,
// without advice about actions and payloads that does not apply to it.
func TestInvalidSaysWhatIsWrong(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.connect(tokA)
	detail := "unknown confirmId c9 for this session (it was never proposed here): call observe to see the current state"
	h.lap.on("/confirm-result", func(int, fakeCall) (any, error) {
		return nil, &lap.Error{Status: 400, Code: "invalid", Detail: detail}
	})
	out := h.call("get_confirm_result", map[string]any{"confirmId": "c9"})
	wantError(t, out, "invalid", detail)
	if strings.Count(out.Text, "unknown confirmId") != 1 || strings.Contains(out.Text, "payloads") {
		t.Fatalf("text %q: want the detail once and no advice about payloads", out.Text)
	}
	if e, _ := out.SC["error"].(map[string]any); e["detail"] != detail {
		t.Fatalf("structured detail %v", e["detail"])
	}
}

// tools/list names the core six by default, and every tool answers when
// called by name (a client written for the reference's bridge calls
// describe_app, list_actions, get_state, …).
func TestUnlistedToolsAnswer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.Tools = ToolsCore })
	res, err := h.c.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil || len(res.Tools) != 6 || res.Tools[0].Name != "connect_session" {
		t.Fatalf("tools/list: %v, %d tools", err, len(res.Tools))
	}
	h.lap.on("/observe", observeWith(twoActions))
	h.connect(tokA)
	h.lap.on("/state", func(int, fakeCall) (any, error) { return json.RawMessage(`{"state":{"n":1}}`), nil })
	if out := h.call("get_state", nil); out.IsError || mcpJSON(out.SC["state"]) != `{"n":1}` {
		t.Fatalf("get_state, not listed: %s", out.Text)
	}
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "no_such_tool"
	if res, err := h.c.CallTool(context.Background(), req); err == nil && !res.IsError {
		t.Fatal("an unknown tool answered")
	}
}
