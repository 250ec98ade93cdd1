package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lapdtest"
)

// The README's "done when": a scripted MCP client, following the README,
// connects with a pasted line, observes, dispatches, gets a confirmation
// outcome and narrates.

func TestReadmeFlow_Stdio(t *testing.T) {
	t.Parallel()
	s := startServer(t, "")
	tab, m := mcpTab(t, s)
	// Claude Desktop's config runs `lapd mcp`; --url is the default LAP base.
	mcpReadmeFlow(t, mcpDialStdio(t, s), tab, m)
}

func TestReadmeFlow_HTTP(t *testing.T) {
	t.Parallel()
	s := startServer(t, "")
	tab, m := mcpTab(t, s)
	// `claude mcp add --transport http lapd <url>/agent/mcp`; the client
	// negotiates the newest era both sides speak.
	c, err := client.NewStreamableHttpClient(s.URL + "/agent/mcp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	mcpInitialize(t, c, mcpgo.LATEST_PROTOCOL_VERSION)
	mcpReadmeFlow(t, c, tab, m)
}

func mcpReadmeFlow(t *testing.T, c *client.Client, tab *lapdtest.Tab, m mintResp) {
	// 1. The user pastes the line from the app's "Connect an AI" panel
	//    (what the bridge's `connect` prompt turns into a connect_session call).
	line := mcpLine(m)
	p := mcpgo.GetPromptRequest{}
	p.Params.Name = "connect"
	p.Params.Arguments = map[string]string{"line": line}
	pr, err := c.GetPrompt(context.Background(), p)
	if err != nil || len(pr.Messages) != 1 {
		t.Fatalf("connect prompt: %v", err)
	}
	if tc, ok := mcpgo.AsTextContent(pr.Messages[0].Content); !ok || !strings.Contains(tc.Text, "connect_session") || !strings.Contains(tc.Text, line) {
		t.Fatalf("connect prompt text: %+v", pr.Messages[0].Content)
	}
	out := mcpOK(t, c, "connect_session", map[string]any{"line": line})
	h := mcpString(out.SC["session"])
	if out.SC["status"] != "connected" || h == "" || !strings.Contains(mcpString(out.SC["next"]), "send_message") {
		t.Fatalf("connect_session: %s", out.Text)
	}
	S := func(a map[string]any) map[string]any { a["session"] = h; return a }

	// 2. observe
	out = mcpOK(t, c, "observe", S(map[string]any{}))
	if mcpPath(out.SC, "state.count") != 0.0 || len(mcpVariants(out.SC["actions"])) != 3 || mcpPath(out.SC, "health.connected") != true {
		t.Fatalf("observe: %s", out.Text)
	}

	// 3. narrate before multi-step work, then dispatch.
	if out = mcpOK(t, c, "narrate", S(map[string]any{"text": "Adding a task, then clearing the board"})); out.SC["ok"] != true {
		t.Fatalf("narrate: %s", out.Text)
	}
	mcpWaitFrame(t, tab, "the narration in the tab", func(f lapdtest.Frame) bool {
		return f.T == "log-push" && strings.Contains(string(f.Raw), "Adding a task, then clearing the board")
	})
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "addTodo", "title": "Buy milk"}}))
	if out.SC["status"] != "dispatched" || mcpPath(out.SC, "stateDiff.0.path") != "/todos" {
		t.Fatalf("send_message addTodo: %s", out.Text)
	}

	// 4. An action that needs the user's approval: the human approves in
	//    the app while the model waits for the outcome.
	out = mcpOK(t, c, "send_message", S(map[string]any{"msg": map[string]any{"type": "clearAll"}, "timeoutMs": 100}))
	cid := mcpString(out.SC["confirmId"])
	if out.SC["status"] != "pending-confirmation" || cid == "" {
		t.Fatalf("send_message clearAll: %s", out.Text)
	}
	done := make(chan mcpOut, 1)
	go func() {
		o, err := mcpTryCall(ctxT(t, 30*time.Second), c, "get_confirm_result", S(map[string]any{"confirmId": cid, "timeoutMs": 15000}))
		if err != nil {
			o = mcpOut{IsError: true, Text: err.Error()}
		}
		done <- o
	}()
	if ids := tab.PendingConfirms(); len(ids) != 1 || ids[0] != cid {
		t.Fatalf("tab pending approvals %v, want [%s]", ids, cid)
	}
	if err := tab.Approve(ctxT(t, 10*time.Second), cid); err != nil {
		t.Fatal(err)
	}
	out = <-done
	if out.IsError || out.SC["status"] != "confirmed" || len(mcpPath(out.SC, "stateAfter.todos").([]any)) != 0 {
		t.Fatalf("get_confirm_result: %s", out.Text)
	}

	// 5. narrate the outcome.
	mcpOK(t, c, "narrate", S(map[string]any{"text": "Done: the board is clear"}))
	mcpWaitFrame(t, tab, "the closing narration", func(f lapdtest.Frame) bool {
		return f.T == "log-push" && strings.Contains(string(f.Raw), "Done: the board is clear")
	})
}
