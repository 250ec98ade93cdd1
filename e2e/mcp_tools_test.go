package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lapdtest"
)

// fast enough that the suites never meet the per-token rate limit
const mcpNoRateLimit = "100000"

// TestMCPTools runs every tool's success path and the main failure paths
// against the real binary, over stdio and over Streamable HTTP (both eras),
// each with its own `lapd serve` and a paired fake tab.
func TestMCPTools(t *testing.T) {
	t.Parallel()
	for _, tr := range mcpTransports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, "", append([]string{"--lap-rate", mcpNoRateLimit}, mcpAllTools...)...)
			tab, m := mcpTab(t, s)
			c := tr.dial(t, s)
			mcpToolSuite(t, s, c, tab, m, tr.modern)
		})
	}
}

func mcpToolSuite(t *testing.T, s *server, c *client.Client, tab *lapdtest.Tab, m mintResp, modern bool) {
	// The catalogue: 16 tools, connect_session first.
	lt, err := c.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	if err != nil || len(lt.Tools) != 16 || lt.Tools[0].Name != "connect_session" {
		t.Fatalf("tools/list: %v (%d tools)", err, len(lt.Tools))
	}

	// Unbound: nothing connected yet.
	if modern {
		mcpWantError(t, mcpCall(t, c, "observe", nil), "session-required", "connect_session")
	} else {
		mcpWantError(t, mcpCall(t, c, "observe", nil), "unbound", "connect_session")
	}
	// A bad line never binds.
	mcpWantError(t, mcpCall(t, c, "connect_session", map[string]any{"line": "hello there"}), "invalid-arguments")

	// connect_session with the pasted line: the first observation, lean
	// (no description block, no health while the tab is fine).
	h, out := mcpConnect(t, c, m)
	if out.SC["appName"] != "lapdtest" || mcpPath(out.SC, "state.count") != 0.0 || mcpPath(out.SC, "docs.purpose") != "A fake app for tests" ||
		out.SC["description"] != nil || out.SC["health"] != nil || !slices.Equal(mcpVariants(out.SC["actions"]), []string{"inc", "addTodo", "clearAll"}) {
		t.Fatalf("connect_session result: %s", out.Text)
	}
	if strings.Contains(out.Text, m.Token) {
		t.Fatal("connect_session echoed the token")
	}
	if h2, _ := mcpConnect(t, c, m); h2 != h {
		t.Fatalf("reconnecting with the same line gave a new handle %s (was %s)", h2, h)
	}
	S := func(a map[string]any) map[string]any {
		if a == nil {
			a = map[string]any{}
		}
		a["session"] = h
		return a
	}

	// observe: the whole picture; verbose: the LAP body as it came.
	out = mcpOK(t, c, "observe", S(nil))
	if out.SC["appName"] != "lapdtest" || mcpPath(out.SC, "context.summary") != "A fake tab" || mcpPath(out.SC, "stateSchema.type") != "object" {
		t.Fatalf("observe: %s", out.Text)
	}
	if v := mcpOK(t, c, "observe", S(map[string]any{"verbose": true})); mcpPath(v.SC, "health.connected") != true || mcpPath(v.SC, "description.schemaHash") != "lapdtest-1" {
		t.Fatalf("observe verbose: %s", v.Text)
	}
	if vs := mcpVariants(out.SC["actions"]); !slices.Equal(vs, []string{"inc", "addTodo", "clearAll"}) {
		t.Fatalf("observe actions = %v (reset is human-only and must not be listed)", vs)
	}
	if !modern {
		// the only binding is the default
		if o := mcpOK(t, c, "observe", nil); o.SC["appName"] != "lapdtest" {
			t.Fatalf("observe without session: %s", o.Text)
		}
	}

	// describe_app
	out = mcpOK(t, c, "describe_app", S(nil))
	if out.SC["name"] != "lapdtest" || out.SC["version"] != "1.0.0" || out.SC["schemaHash"] != "lapdtest-1" {
		t.Fatalf("describe_app: %s", out.Text)
	}

	// get_state / query_state
	if out = mcpOK(t, c, "get_state", S(map[string]any{"path": "/count"})); out.SC["state"] != 0.0 {
		t.Fatalf("get_state /count: %s", out.Text)
	}
	if out = mcpOK(t, c, "get_state", S(nil)); mcpPath(out.SC, "state.count") != 0.0 {
		t.Fatalf("get_state: %s", out.Text)
	}
	if out = mcpOK(t, c, "query_state", S(map[string]any{"path": "/count"})); out.SC["found"] != true || out.SC["value"] != 0.0 {
		t.Fatalf("query_state /count: %s", out.Text)
	}
	if out = mcpOK(t, c, "query_state", S(map[string]any{"path": "/nope"})); out.SC["found"] != false {
		t.Fatalf("query_state /nope: %s", out.Text)
	}
	mcpWantError(t, mcpCall(t, c, "query_state", S(nil)), "invalid-arguments", "path is required")

	// list_actions
	if out = mcpOK(t, c, "list_actions", S(nil)); !slices.Equal(mcpVariants(out.SC["actions"]), []string{"inc", "addTodo", "clearAll"}) {
		t.Fatalf("list_actions: %s", out.Text)
	}

	// would_dispatch predicts without changing anything.
	out = mcpOK(t, c, "would_dispatch", S(map[string]any{"msg": map[string]any{"type": "inc"}}))
	if out.SC["status"] != "predicted" || mcpPath(out.SC, "stateDiff.0.path") != "/count" || mcpPath(out.SC, "stateDiff.0.value") != 1.0 {
		t.Fatalf("would_dispatch: %s", out.Text)
	}
	if st := tab.State().(map[string]any); st["count"] != 0.0 {
		t.Fatalf("would_dispatch changed the state: %v", st)
	}

	// send_message dispatches and returns a diff; the actions only when they
	// changed since the model was shown them (here they did not).
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "inc"}, "idempotencyKey": "e2e-inc-1"}))
	if out.SC["status"] != "dispatched" || mcpPath(out.SC, "stateDiff.0.value") != 1.0 || out.SC["actions"] != nil || out.SC["actionsChanged"] != nil || out.SC["drain"] != nil {
		t.Fatalf("send_message inc: %s", out.Text)
	}
	// Same idempotencyKey: the first outcome, no second dispatch.
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "inc"}, "idempotencyKey": "e2e-inc-1"}))
	if out.SC["status"] != "dispatched" || tab.State().(map[string]any)["count"] != 1.0 {
		t.Fatalf("repeated idempotencyKey dispatched twice: %s; state %v", out.Text, tab.State())
	}
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "addTodo", "title": "Buy milk"}, "verbose": true}))
	if out.SC["status"] != "dispatched" || !strings.HasPrefix(mcpString(out.SC["idempotencyKey"]), "mcp_") || len(mcpVariants(out.SC["actions"])) != 3 || out.SC["drain"] == nil {
		t.Fatalf("send_message addTodo verbose: %s", out.Text)
	}
	if got := mcpPath(tab.State(), "todos.0.title"); got != "Buy milk" {
		t.Fatalf("tab state after addTodo: %v", tab.State())
	}

	// A batch: dispatched in order, one combined diff, one status (no
	// entry per message when all were dispatched), and one audited
	// dispatch per message.
	out = mcpOK(t, c, "send_message", S(map[string]any{"msgs": []any{
		map[string]any{"type": "inc"}, map[string]any{"type": "addTodo", "title": "Walk dog"}, map[string]any{"type": "inc"}}}))
	if out.SC["status"] != "dispatched" || out.SC["results"] != nil ||
		mcpPath(tab.State(), "count") != 3.0 || mcpPath(tab.State(), "todos.1.title") != "Walk dog" {
		t.Fatalf("send_message msgs: %s; tab %v", out.Text, tab.State())
	}
	mcpEventually(t, "one msg-dispatched audit entry per message of the batch", func() bool { return mcpAuditedCount(s, "msg-dispatched", m.TID) >= 5 })

	// Refusals are answers, not failures: status rejected with a reason.
	// Schema error: checked by lapd before any frame reaches the tab.
	before := tab.RPCCount("send_message")
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "addTodo"}}))
	if out.SC["status"] != "rejected" || out.SC["reason"] != "schema-error" || !strings.Contains(mcpString(out.SC["next"]), "errors") {
		t.Fatalf("schema-error: %s", out.Text)
	}
	if errs, _ := out.SC["errors"].([]any); len(errs) == 0 || mcpPath(errs[0], "path") != "/title" {
		t.Fatalf("schema-error errors: %s", mcpJSON(out.SC))
	}
	// Human-only: refused, and the tab receives no rpc for it.
	if out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "reset"}})); out.SC["reason"] != "human-only" || !strings.Contains(mcpString(out.SC["next"]), "ask them") {
		t.Fatalf("human-only: %s", out.Text)
	}
	if got := tab.RPCCount("send_message"); got != before {
		t.Fatalf("the tab got %d send_message rpcs for refused messages", got-before)
	}
	if slices.Contains(mcpRPCVariants(tab), "send_message:reset") || slices.Contains(mcpRPCVariants(tab), "would_dispatch:reset") {
		t.Fatalf("a human-only message reached the tab: %v", mcpRPCVariants(tab))
	}
	// Unknown variant.
	if out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "explode"}})); out.SC["status"] != "rejected" || out.SC["reason"] != "invalid" {
		t.Fatalf("unknown variant: %s", out.Text)
	}

	// Approvals: pending (approvalTimeoutMs 0: return at once), still pending, approved.
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "clearAll"}, "approvalTimeoutMs": 0}))
	cid := mcpString(out.SC["confirmId"])
	if out.SC["status"] != "pending-confirmation" || cid == "" || !strings.Contains(mcpString(out.SC["next"]), cid) {
		t.Fatalf("send_message clearAll: %s", out.Text)
	}
	out = mcpOK(t, c, "get_confirm_result", S(map[string]any{"confirmId": cid, "timeoutMs": 100}))
	if out.SC["status"] != "still-pending" || !strings.Contains(mcpString(out.SC["next"]), "approve") {
		t.Fatalf("get_confirm_result (pending): %s", out.Text)
	}
	if err := tab.Approve(ctxT(t, 10*time.Second), cid); err != nil {
		t.Fatal(err)
	}
	out = mcpOK(t, c, "get_confirm_result", S(map[string]any{"confirmId": cid}))
	if out.SC["status"] != "confirmed" || mcpPath(out.SC, "stateAfter.todos") == nil {
		t.Fatalf("get_confirm_result (approved): %s", out.Text)
	}
	if todos := mcpPath(tab.State(), "todos").([]any); len(todos) != 0 {
		t.Fatalf("clearAll approved but todos = %v", todos)
	}
	// ... and rejected: an answer, not a failure.
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "clearAll"}, "approvalTimeoutMs": 0}))
	cid = mcpString(out.SC["confirmId"])
	if err := tab.Reject(ctxT(t, 10*time.Second), cid); err != nil {
		t.Fatal(err)
	}
	if out = mcpOK(t, c, "get_confirm_result", S(map[string]any{"confirmId": cid})); out.SC["status"] != "rejected" || out.SC["reason"] != "user-cancelled" || !strings.Contains(mcpString(out.SC["next"]), "do not retry") {
		t.Fatalf("get_confirm_result after reject: %s", out.Text)
	}

	// wait_for_change: the human changes the state while the model waits.
	type res struct {
		out mcpOut
		err error
	}
	done := make(chan res, 1)
	go func() {
		o, err := mcpTryCall(ctxT(t, 30*time.Second), c, "wait_for_change", S(map[string]any{"path": "/count", "timeoutMs": 15000}))
		done <- res{o, err}
	}()
	mcpWaitFrame(t, tab, "the watch frame", func(f lapdtest.Frame) bool { return f.T == "watch" })
	if err := tab.SetState(map[string]any{"count": 42.0, "todos": []any{}}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.out.IsError || r.out.SC["status"] != "changed" || r.out.SC["value"] != 42.0 || r.out.SC["stateAfter"] != nil {
		t.Fatalf("wait_for_change: %v %s", r.err, r.out.Text)
	}
	if out = mcpOK(t, c, "wait_for_change", S(map[string]any{"path": "/count", "timeoutMs": 50})); out.SC["status"] != "timeout" {
		t.Fatalf("wait_for_change (quiet): %s", out.Text)
	}

	// narrate reaches the tab's activity feed as a log-push.
	if out = mcpOK(t, c, "narrate", S(map[string]any{"text": "Adding your tasks now"})); out.SC["ok"] != true {
		t.Fatalf("narrate: %s", out.Text)
	}
	mcpWaitFrame(t, tab, "the narrate log-push", func(f lapdtest.Frame) bool {
		return f.T == "log-push" && strings.Contains(string(f.Raw), "Adding your tasks now")
	})

	// describe_recent_actions: the tab echoes the narration into its log ring.
	mcpEventually(t, "the narration in recent actions", func() bool {
		o := mcpOK(t, c, "describe_recent_actions", S(map[string]any{"n": 20, "kind": "narrate"}))
		es, _ := o.SC["entries"].([]any)
		return len(es) > 0 && mcpPath(es[0], "detail") == "Adding your tasks now"
	})
	out = mcpOK(t, c, "describe_recent_actions", S(map[string]any{"n": 50}))
	if es, _ := out.SC["entries"].([]any); len(es) < 3 {
		t.Fatalf("describe_recent_actions: %s", out.Text)
	}

	// The DOM-ish tools.
	if out = mcpOK(t, c, "query_dom", S(map[string]any{"name": "save"})); mcpPath(out.SC, "elements.0.attrs.data-agent") != "save" {
		t.Fatalf("query_dom: %s", out.Text)
	}
	if out = mcpOK(t, c, "describe_visible_content", S(nil)); out.SC["url"] != "http://lapdtest.test/" || out.SC["source"] != "fallback" || mcpPath(out.SC, "outline.0.text") != "Fake" {
		t.Fatalf("describe_visible_content: %s", out.Text)
	}
	if out = mcpOK(t, c, "describe_context", S(nil)); mcpPath(out.SC, "context.summary") != "A fake tab" {
		t.Fatalf("describe_context: %s", out.Text)
	}

	// The dispatches are audited and `lapd audit` finds them in the data dir.
	mcpEventually(t, "lapd audit to print msg-dispatched", func() bool {
		b, err := exec.Command(lapdBin, "audit", "--data-dir", s.DataDir, "--event", "msg-dispatched").CombinedOutput()
		return err == nil && strings.Contains(string(b), "msg-dispatched") && strings.Contains(string(b), "addTodo")
	})

	// disconnect_session forgets the binding.
	if out = mcpOK(t, c, "disconnect_session", S(nil)); out.SC["status"] != "disconnected" || out.SC["session"] != h {
		t.Fatalf("disconnect_session: %s", out.Text)
	}
	mcpWantError(t, mcpCall(t, c, "observe", S(nil)), "unknown-session", "connect_session")

	// Revoked: the user revokes in the app; the next call says so.
	h, _ = mcpConnect(t, c, m)
	// (an anonymous session is revoked with proof: this one was minted
	// without a tab secret, so its token)
	if st := s.postJSON(t, "/agent/revoke", "", map[string]string{"tid": m.TID, "token": m.Token}, nil); st != 200 {
		t.Fatalf("revoke: status %d", st)
	}
	mcpWantError(t, mcpCall(t, c, "observe", map[string]any{"session": h}), "revoked", "revoked", "connect line")
	for _, tool := range []string{"get_state", "narrate"} {
		a := map[string]any{"session": h}
		if tool == "narrate" {
			a["text"] = "still there?"
		}
		mcpWantError(t, mcpCall(t, c, tool, a), "revoked")
	}
}

// mcpAuditedCount counts the server's stdout audit entries of event for tid.
func mcpAuditedCount(s *server, event, tid string) int {
	n := 0
	for _, line := range strings.Split(s.audit.String(), "\n") {
		var e struct{ Event, TID string }
		if json.Unmarshal([]byte(line), &e) == nil && e.Event == event && e.TID == tid {
			n++
		}
	}
	return n
}

func mcpVariants(actions any) []string {
	as, _ := actions.([]any)
	var out []string
	for _, a := range as {
		out = append(out, mcpString(mcpPath(a, "variant")))
	}
	return out
}

func mcpString(v any) string { s, _ := v.(string); return s }
