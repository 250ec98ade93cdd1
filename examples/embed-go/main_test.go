package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd/lapdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// todos is what the page declares to lapd.js, as a lapdtest.App: the tab
// below plays the page without a browser.
var todos = lapdtest.App{
	Name:  "Todos",
	State: map[string]any{"todos": []any{}},
	Actions: []lapdtest.Action{
		{
			Variant: "add", Intent: "Add a task",
			Schema: json.RawMessage(`{"type":"object","properties":{"title":{"type":"string","minLength":1}},"required":["title"],"additionalProperties":false}`),
			Apply: func(st any, msg map[string]any) (any, error) {
				m := st.(map[string]any)
				m["todos"] = append(m["todos"].([]any), msg["title"])
				return m, nil
			},
		},
		{
			Variant: "clear", Intent: "Delete every task", RequiresConfirm: true,
			Apply: func(any, map[string]any) (any, error) { return map[string]any{"todos": []any{}}, nil },
		},
	},
}

// The app's user logs in, mints from the page's side, a fake tab plays the
// page, and a model drives it through MCP at /agent/mcp.
func TestDriveThroughMCP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	app, err := newServer(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(app.mux)
	defer srv.Close()
	defer app.agent.Shutdown(context.Background())

	// Not logged in: lapd refuses to mint.
	if _, err := lapdtest.Mint(ctx, nil, srv.URL+"/agent/mint"); err == nil {
		t.Fatal("mint without the app's session succeeded")
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	res, err := browser.Get(srv.URL + "/login?user=alice")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	sess, err := lapdtest.Mint(ctx, browser, srv.URL+"/agent/mint")
	if err != nil {
		t.Fatal(err)
	}
	tab, err := sess.Pair(ctx, lapdtest.WithApp(todos))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()

	// The model's side: an MCP client on the app's own server.
	c, err := client.NewStreamableHttpClient(srv.URL + "/agent/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "embed-go-test", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	try := func(name string, args map[string]any) (map[string]any, bool) {
		t.Helper()
		req := mcpgo.CallToolRequest{}
		req.Params.Name, req.Params.Arguments = name, args
		r, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var out map[string]any
		b, _ := json.Marshal(r.StructuredContent)
		_ = json.Unmarshal(b, &out)
		return out, r.IsError
	}
	call := func(name string, args map[string]any) map[string]any {
		t.Helper()
		out, isErr := try(name, args)
		if isErr {
			t.Fatalf("%s: isError: %s", name, mustJSON(out))
		}
		return out
	}

	out := call("connect_session", map[string]any{"line": sess.ConnectLine()})
	h, _ := out["session"].(string)
	if out["status"] != "connected" || h == "" {
		t.Fatalf("connect_session: %v", out)
	}
	if out = call("observe", map[string]any{"session": h}); out["appName"] != "Todos" {
		t.Errorf("observe: %v", out)
	}
	if out = call("send_message", map[string]any{"session": h, "msg": map[string]any{"type": "add", "title": "Buy milk"}}); out["status"] != "dispatched" {
		t.Fatalf("add: %v", out)
	}
	// A refusal is an answer (isError false) with a status and a reason.
	if out, isErr := try("send_message", map[string]any{"session": h, "msg": map[string]any{"type": "add"}}); isErr || out["status"] != "rejected" || out["reason"] != "schema-error" {
		t.Errorf("add without a title: %v", out)
	}
	// An action that needs the human: lapd has recorded the proposal once
	// send_message answers pending-confirmation (at once with
	// approvalTimeoutMs 0), so the human may approve.
	out = call("send_message", map[string]any{"session": h, "msg": map[string]any{"type": "clear"}, "approvalTimeoutMs": 0})
	cid, _ := out["confirmId"].(string)
	if out["status"] != "pending-confirmation" || cid == "" {
		t.Fatalf("clear: %v", out)
	}
	if err := tab.Approve(ctx, cid); err != nil {
		t.Fatal(err)
	}
	if out = call("get_confirm_result", map[string]any{"session": h, "confirmId": cid, "timeoutMs": 10000}); out["status"] != "confirmed" {
		t.Errorf("get_confirm_result: %v", out)
	}
	if got := tab.State().(map[string]any)["todos"].([]any); len(got) != 0 {
		t.Errorf("todos after the approved clear: %v", got)
	}
}

func TestPage(t *testing.T) {
	app, err := newServer(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer app.agent.Shutdown(context.Background())
	for _, tc := range []struct{ path, want string }{
		{"/", "Log in as alice"},
		{"/agent/client.js", "export function createAgent"},
	} {
		rec := httptest.NewRecorder()
		app.mux.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("GET %s: %d, want %q", tc.path, rec.Code, tc.want)
		}
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }
