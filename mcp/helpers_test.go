package mcp

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd/audit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	tokA = "agt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	tokB = "agt_BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
	base = "http://127.0.0.1:8080/agent/lap/v1"
)

type fakeCall struct {
	Base, Token, Route string
	Body               map[string]any
	RID                string // the request id the call's context carries
}

// fakeLAP is a scriptable lap.Client. Each route's handler gets the call
// number (1-based) for that route and the decoded body.
type fakeLAP struct {
	mu     sync.Mutex
	calls  []fakeCall
	counts map[string]int
	routes map[string]func(n int, c fakeCall) (any, error)
}

func newFakeLAP() *fakeLAP {
	f := &fakeLAP{counts: map[string]int{}, routes: map[string]func(int, fakeCall) (any, error){}}
	f.on("/observe", func(int, fakeCall) (any, error) { return observeBody("Todo", "h1"), nil })
	return f
}

func observeBody(name, hash string) map[string]any {
	return map[string]any{
		"state":       map[string]any{"todos": []any{}},
		"actions":     []any{map[string]any{"variant": "addTodo"}},
		"description": map[string]any{"name": name, "version": "1.0", "schemaHash": hash},
		"context":     nil,
		"health":      map[string]any{"connected": true, "reconnects": 0},
	}
}

func (f *fakeLAP) on(route string, h func(n int, c fakeCall) (any, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes[route] = h
}

func (f *fakeLAP) Call(ctx context.Context, b, token, route string, body any) (json.RawMessage, error) {
	c := fakeCall{Base: b, Token: token, Route: route, RID: audit.RequestID(ctx)}
	if body != nil {
		raw, _ := json.Marshal(body)
		_ = json.Unmarshal(raw, &c.Body)
	}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.counts[route]++
	n := f.counts[route]
	h := f.routes[route]
	f.mu.Unlock()
	if h == nil {
		return json.RawMessage(`{"ok":true}`), nil
	}
	v, err := h(n, c)
	if err != nil {
		return nil, err
	}
	raw, _ := json.Marshal(v)
	return raw, nil
}

func (f *fakeLAP) callsTo(route string) []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeCall
	for _, c := range f.calls {
		if c.Route == route {
			out = append(out, c)
		}
	}
	return out
}

// recordingAfter fires at once and records the waits asked for.
type recordingAfter struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (r *recordingAfter) After(d time.Duration) <-chan time.Time {
	r.mu.Lock()
	r.waits = append(r.waits, d)
	r.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch
}

func (r *recordingAfter) got() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.waits...)
}

type harness struct {
	t     testing.TB
	lap   *fakeLAP
	after *recordingAfter
	exec  *Executor
	c     *client.Client
}

// newHarness starts a real mcp-go in-process client against NewServer.
func newHarness(t testing.TB, mutate func(*Config), opts ...client.ClientOption) *harness {
	t.Helper()
	h := &harness{t: t, lap: newFakeLAP(), after: &recordingAfter{}}
	cfg := Config{Client: h.lap, After: h.after.After, Tools: ToolsAll}
	if mutate != nil {
		mutate(&cfg)
	}
	s, e, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.exec = e
	c, err := client.NewInProcessClientWithOptions(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "test", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	h.c = c
	return h
}

type toolOut struct {
	IsError bool
	Text    string
	SC      map[string]any
}

func callOn(t testing.TB, c *client.Client, name string, a map[string]any, meta *mcpgo.Meta) toolOut {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = a
	req.Params.Meta = meta
	res, err := c.CallTool(context.Background(), req)
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	var out toolOut
	out.IsError = res.IsError
	if len(res.Content) > 0 {
		if tc, ok := mcpgo.AsTextContent(res.Content[0]); ok {
			out.Text = tc.Text
		}
	}
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &out.SC)
	return out
}

func (h *harness) call(name string, a map[string]any) toolOut {
	h.t.Helper()
	return callOn(h.t, h.c, name, a, nil)
}

func (h *harness) connect(tok string) string {
	h.t.Helper()
	out := h.call("connect_session", map[string]any{"url": base, "token": tok})
	if out.IsError {
		h.t.Fatalf("connect: %s", out.Text)
	}
	return out.SC["session"].(string)
}

func wantError(t *testing.T, out toolOut, code string, contains ...string) {
	t.Helper()
	if !out.IsError {
		t.Fatalf("want isError %s, got success %s", code, out.Text)
	}
	if !strings.HasPrefix(out.Text, code+": ") {
		t.Fatalf("want text starting %q, got %q", code+": ", out.Text)
	}
	e, _ := out.SC["error"].(map[string]any)
	if e["code"] != code {
		t.Fatalf("structured error code = %v, want %s", e["code"], code)
	}
	for _, s := range contains {
		if !strings.Contains(out.Text, s) {
			t.Fatalf("text %q does not contain %q", out.Text, s)
		}
	}
}
