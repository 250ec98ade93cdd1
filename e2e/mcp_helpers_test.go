package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lapdtest"
)

// mcpTransport names one way an MCP client reaches lapd.
type mcpTransport struct {
	name string
	// modern: the client negotiates 2026-07-28 over HTTP and has no MCP
	// session, so lapd never picks a default binding for it.
	modern bool
	dial   func(t testing.TB, s *server) *client.Client
}

// mcpTransports are the three ways the suites run: the stdio bridge
// (`lapd mcp` child process), Streamable HTTP in the modern era, and
// Streamable HTTP pinned to 2025-11-25 (legacy, with an MCP session).
//
// These suites exercise every tool, so their servers and bridges run with
// --tools all (mcpAllTools); the README flow runs on the defaults.
var mcpTransports = []mcpTransport{
	{name: "stdio", dial: func(t testing.TB, s *server) *client.Client { return mcpDialStdioBin(t, lapdBin, s, mcpAllTools...) }},
	{name: "http-modern", modern: true, dial: func(t testing.TB, s *server) *client.Client { return mcpDialHTTP(t, s, false) }},
	{name: "http-2025-11-25", dial: func(t testing.TB, s *server) *client.Client { return mcpDialHTTP(t, s, true) }},
}

func mcpInitialize(t testing.TB, c *client.Client, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = version
	init.Params.ClientInfo = mcpgo.Implementation{Name: "lapd-e2e", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize: %v", err)
	}
}

// mcpDialStdio starts `lapd mcp --url <lap base>` as a child process and
// initializes an mcp-go client over its stdin/stdout.
func mcpDialStdio(t testing.TB, s *server) *client.Client {
	t.Helper()
	return mcpDialStdioBin(t, lapdBin, s)
}

// mcpAllTools lists every tool (the default is the core set).
var mcpAllTools = []string{"--tools", "all"}

// mcpDialStdioBin is mcpDialStdio with another lapd binary and extra flags.
func mcpDialStdioBin(t testing.TB, bin string, s *server, extra ...string) *client.Client {
	t.Helper()
	args := append([]string{"mcp", "--url", s.URL + "/agent/lap/v1"}, extra...)
	c, err := client.NewStdioMCPClient(bin, []string{"LAPD_URL=", "LAPD_LOG_LEVEL=", "LAPD_TOOLS="}, args...)
	if err != nil {
		t.Fatalf("starting lapd mcp: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	mcpInitialize(t, c, mcpgo.LATEST_PROTOCOL_VERSION)
	return c
}

// mcpDialHTTP connects an mcp-go Streamable HTTP client to /agent/mcp;
// legacy pins protocol 2025-11-25 (initialize handshake, MCP session).
func mcpDialHTTP(t testing.TB, s *server, legacy bool) *client.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(s.URL+"/agent/mcp", transport.WithHTTPTimeout(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var opts []client.ClientOption
	version := mcpgo.LATEST_PROTOCOL_VERSION
	if legacy {
		opts = append(opts, client.WithProtocolVersion(mcpgo.ProtocolVersion20251125))
		version = mcpgo.ProtocolVersion20251125
	}
	c := client.NewClient(tr, opts...)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	mcpInitialize(t, c, version)
	if legacy && (c.GetSessionId() == "" || c.ProtocolVersion() != mcpgo.ProtocolVersion20251125) {
		t.Fatalf("legacy client: session %q, version %q", c.GetSessionId(), c.ProtocolVersion())
	}
	if !legacy && !mcpgo.IsModernProtocol(c.ProtocolVersion()) {
		t.Fatalf("modern client negotiated %q", c.ProtocolVersion())
	}
	return c
}

// mcpOut is one tool result, decoded.
type mcpOut struct {
	IsError bool
	Text    string
	SC      map[string]any
}

// errCode is structuredContent.error.code ("" on success).
func (o mcpOut) errCode() string {
	e, _ := o.SC["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// mcpCall calls a tool; a protocol-level error fails the test (tool
// failures are isError results, never protocol errors).
func mcpCall(t testing.TB, c *client.Client, name string, args map[string]any) mcpOut {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	out, err := mcpTryCall(ctx, c, name, args)
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return out
}

func mcpTryCall(ctx context.Context, c *client.Client, name string, args map[string]any) (mcpOut, error) {
	req := mcpgo.CallToolRequest{}
	req.Params.Name = name
	if args != nil {
		req.Params.Arguments = args
	}
	res, err := c.CallTool(ctx, req)
	if err != nil {
		return mcpOut{}, err
	}
	out := mcpOut{IsError: res.IsError}
	if len(res.Content) > 0 {
		if tc, ok := mcpgo.AsTextContent(res.Content[0]); ok {
			out.Text = tc.Text
		}
	}
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &out.SC)
	return out, nil
}

// mcpOK calls a tool and fails unless it succeeded.
func mcpOK(t testing.TB, c *client.Client, name string, args map[string]any) mcpOut {
	t.Helper()
	out := mcpCall(t, c, name, args)
	if out.IsError {
		t.Fatalf("%s(%v): isError: %s", name, args, out.Text)
	}
	if out.SC == nil {
		t.Fatalf("%s: no structuredContent (text %q)", name, out.Text)
	}
	return out
}

// mcpWantError checks an isError result: code first in the text and in
// structuredContent.error.code, plus the given fragments in the text.
func mcpWantError(t testing.TB, out mcpOut, code string, contains ...string) {
	t.Helper()
	if !out.IsError {
		t.Fatalf("want isError %s, got success: %s", code, out.Text)
	}
	if !strings.HasPrefix(out.Text, code+": ") {
		t.Fatalf("want text starting %q, got %q", code+": ", out.Text)
	}
	if got := out.errCode(); got != code {
		t.Fatalf("structuredContent.error.code = %q, want %q (text %q)", got, code, out.Text)
	}
	for _, s := range contains {
		if !strings.Contains(out.Text, s) {
			t.Fatalf("error text %q does not contain %q", out.Text, s)
		}
	}
}

// mcpLine is the connect line the app's panel shows.
func mcpLine(m mintResp) string {
	return "Connect to my app with lapd: connect_session url=" + m.LapURL + " token=" + m.Token
}

// mcpTab mints a token on s and pairs a fake tab carrying the demo policy
// (addTodo has a schema, clearAll requires confirm, reset is human-only).
func mcpTab(t testing.TB, s *server, opts ...lapdtest.Option) (*lapdtest.Tab, mintResp) {
	t.Helper()
	m := s.mintTB(t)
	tab := mcpDial(t, m, opts...)
	return tab, m
}

func mcpDial(t testing.TB, m mintResp, opts ...lapdtest.Option) *lapdtest.Tab {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tab, err := lapdtest.Dial(ctx, m.WSURL, m.Token, append([]lapdtest.Option{lapdtest.WithPolicy(lapdtest.DemoPolicy())}, opts...)...)
	if err != nil {
		t.Fatalf("fake tab dial: %v", err)
	}
	t.Cleanup(func() { tab.Abort() })
	return tab
}

// mintTB is s.mint for benchmarks too.
func (s *server) mintTB(t testing.TB) mintResp {
	t.Helper()
	req, _ := http.NewRequest("POST", s.URL+"/agent/mint", nil)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("mint: %v", err)
	}
	defer resp.Body.Close()
	var m mintResp
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&m) != nil || m.Token == "" {
		t.Fatalf("mint: status %d", resp.StatusCode)
	}
	return m
}

// mcpConnect calls connect_session with the pasted line and returns the handle.
func mcpConnect(t testing.TB, c *client.Client, m mintResp) (string, mcpOut) {
	t.Helper()
	out := mcpOK(t, c, "connect_session", map[string]any{"line": mcpLine(m)})
	h, _ := out.SC["session"].(string)
	if out.SC["status"] != "connected" || !strings.HasPrefix(h, "s_") {
		t.Fatalf("connect_session: %s", out.Text)
	}
	return h, out
}

// mcpEventually polls cond (which may call tools) until it returns true or
// the deadline passes. Only for conditions lapd has no signal for.
func mcpEventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// mcpTabs returns /healthz's paired-tab count.
func (s *server) mcpTabs(t testing.TB) int {
	t.Helper()
	resp, err := http.Get(s.URL + "/healthz")
	if err != nil {
		t.Fatalf("healthz: %v", err)
	}
	defer resp.Body.Close()
	var h struct{ Tabs int }
	_ = json.NewDecoder(resp.Body).Decode(&h)
	return h.Tabs
}

// mcpWaitFrame waits for a frame the tab received that matches pred,
// looking at every frame (not only those after the read cursor).
func mcpWaitFrame(t testing.TB, tab *lapdtest.Tab, what string, pred func(lapdtest.Frame) bool) lapdtest.Frame {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		for _, f := range tab.Frames() {
			if pred(f) {
				return f
			}
		}
		if _, err := tab.Next(ctx); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
}

// mcpRPCsFor lists the msg types of send_message/would_dispatch rpc frames.
func mcpRPCVariants(tab *lapdtest.Tab) []string {
	var out []string
	for _, f := range tab.Frames() {
		if f.T != "rpc" {
			continue
		}
		var r struct {
			Tool string
			Args struct {
				Msg struct{ Type string }
			}
		}
		_ = f.Decode(&r)
		if r.Args.Msg.Type != "" {
			out = append(out, r.Tool+":"+r.Args.Msg.Type)
		}
	}
	return out
}

// mcpJSON is a compact rendering for failure messages.
func mcpJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// mcpPath reads a nested value from structuredContent: "state.count".
func mcpPath(v any, path string) any {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			var i int
			if _, err := fmt.Sscan(k, &i); err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}
