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

// The README's "done when": a scripted MCP client, following the README and
// lapd's instructions on the default (core) tools, connects with a pasted
// line, narrates, dispatches a batch, waits while the human approves, and
// narrates the outcome.

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
	if out.SC["status"] != "connected" || h == "" || !strings.Contains(mcpString(out.SC["next"]), "send_message") ||
		mcpPath(out.SC, "state.count") != 0.0 || len(mcpVariants(out.SC["actions"])) != 3 {
		t.Fatalf("connect_session: %s", out.Text)
	}
	// 2. The result is the first observation: no observe. The model passes
	//    the session handle on every call, as the hint says.
	S := func(a map[string]any) map[string]any { a["session"] = h; return a }

	// 3. narrate before multi-step work, then one batch of dispatches.
	if out = mcpOK(t, c, "narrate", S(map[string]any{"text": "Adding two tasks, then clearing the board"})); out.SC["ok"] != true {
		t.Fatalf("narrate: %s", out.Text)
	}
	mcpWaitFrame(t, tab, "the narration in the tab", func(f lapdtest.Frame) bool {
		return f.T == "log-push" && strings.Contains(string(f.Raw), "Adding two tasks, then clearing the board")
	})
	out = mcpOK(t, c, "send_message", S(map[string]any{"msgs": []any{
		map[string]any{"type": "addTodo", "title": "Buy milk"}, map[string]any{"type": "addTodo", "title": "Walk dog"}}}))
	if out.SC["status"] != "dispatched" || out.SC["results"] != nil || mcpPath(out.SC, "stateDiff.0.path") != "/todos" { // (all dispatched: no results)
		t.Fatalf("send_message msgs: %s", out.Text)
	}

	// 4. An action that needs the user's approval: send_message waits for
	//    the decision while the human approves in the app.
	done := make(chan mcpOut, 1)
	go func() {
		o, err := mcpTryCall(ctxT(t, 30*time.Second), c, "send_message", S(map[string]any{"msg": map[string]any{"type": "clearAll"}}))
		if err != nil {
			o = mcpOut{IsError: true, Text: err.Error()}
		}
		done <- o
	}()
	var cid string
	mcpEventually(t, "the pending approval in the tab", func() bool {
		ids := tab.PendingConfirms()
		if len(ids) == 1 {
			cid = ids[0]
		}
		return cid != ""
	})
	if err := tab.Approve(ctxT(t, 10*time.Second), cid); err != nil {
		t.Fatal(err)
	}
	out = <-done
	if out.IsError || out.SC["status"] != "confirmed" || len(mcpPath(out.SC, "stateAfter.todos").([]any)) != 0 || !strings.Contains(mcpString(out.SC["next"]), "current state") {
		t.Fatalf("send_message clearAll: %s", out.Text)
	}

	// 5. narrate the outcome.
	mcpOK(t, c, "narrate", S(map[string]any{"text": "Done: the board is clear"}))
	mcpWaitFrame(t, tab, "the closing narration", func(f lapdtest.Frame) bool {
		return f.T == "log-push" && strings.Contains(string(f.Raw), "Done: the board is clear")
	})
}
