package mcp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/audit"
)

type auditRec struct {
	mu sync.Mutex
	es []audit.Entry
}

func (a *auditRec) Record(_ context.Context, e audit.Entry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.es = append(a.es, e)
}

func (a *auditRec) has(event, key, val string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.es {
		if e.Event == event && e.Detail[key] == val {
			return true
		}
	}
	return false
}

type httpHarness struct {
	t     testing.TB
	lap   *fakeLAP
	h     *HTTPHandler
	srv   *httptest.Server
	audit *auditRec
}

func newHTTPHarness(t testing.TB, mutate func(*HTTPConfig)) *httpHarness {
	t.Helper()
	hh := &httpHarness{t: t, lap: newFakeLAP(), audit: &auditRec{}}
	cfg := HTTPConfig{Config: Config{Client: hh.lap}, Audit: hh.audit}
	if mutate != nil {
		mutate(&cfg)
	}
	h, err := NewHTTPHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hh.h = h
	hh.srv = httptest.NewServer(h)
	t.Cleanup(func() {
		_ = h.Close(context.Background())
		hh.srv.Close()
	})
	return hh
}

// client starts a real Streamable HTTP client; legacy pins 2025-11-25.
func (hh *httpHarness) client(legacy bool) *client.Client {
	hh.t.Helper()
	tr, err := transport.NewStreamableHTTP(hh.srv.URL)
	if err != nil {
		hh.t.Fatal(err)
	}
	var opts []client.ClientOption
	if legacy {
		opts = append(opts, client.WithProtocolVersion(mcpgo.ProtocolVersion20251125))
	}
	c := client.NewClient(tr, opts...)
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		hh.t.Fatal(err)
	}
	hh.t.Cleanup(func() { _ = c.Close() })
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	if legacy {
		init.Params.ProtocolVersion = mcpgo.ProtocolVersion20251125
	}
	init.Params.ClientInfo = mcpgo.Implementation{Name: "test", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		hh.t.Fatal(err)
	}
	return c
}

func (hh *httpHarness) raw(method, sessionID, body string, hdr map[string]string) *http.Response {
	hh.t.Helper()
	req, _ := http.NewRequest(method, hh.srv.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20251125)
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		hh.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
const listBody = `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`

func TestHTTPBothEras(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)

	modern := hh.client(false)
	if modern.GetSessionId() != "" || !mcpgo.IsModernProtocol(modern.ProtocolVersion()) {
		t.Fatalf("modern client: session %q version %q", modern.GetSessionId(), modern.ProtocolVersion())
	}
	out := callOn(t, modern, "connect_session", map[string]any{"token": tokA}, nil)
	if out.IsError {
		t.Fatal(out.Text)
	}
	handle := out.SC["session"].(string)
	if c := hh.lap.callsTo("/observe")[0]; c.Base != "" || c.Token != tokA {
		t.Fatalf("endpoint mode call %+v", c)
	}
	// A modern client has no MCP session: no default, the handle is the capability.
	wantError(t, callOn(t, modern, "observe", nil, nil), CodeSessionRequired, "handle")
	if out := callOn(t, modern, "observe", map[string]any{"session": handle}, nil); out.IsError {
		t.Fatal(out.Text)
	}

	legacy := hh.client(true)
	if legacy.GetSessionId() == "" || legacy.ProtocolVersion() != mcpgo.ProtocolVersion20251125 {
		t.Fatalf("legacy client: session %q version %q", legacy.GetSessionId(), legacy.ProtocolVersion())
	}
	wantError(t, callOn(t, legacy, "observe", nil, nil), CodeUnbound)
	if out := callOn(t, legacy, "connect_session", map[string]any{"line": "paste: " + tokB}, nil); out.IsError {
		t.Fatal(out.Text)
	}
	if out := callOn(t, legacy, "observe", nil, nil); out.IsError {
		t.Fatalf("legacy default binding: %s", out.Text)
	}
	res, err := legacy.ListTools(context.Background(), mcpgo.ListToolsRequest{})
	// The default tool set is the core.
	if err != nil || len(res.Tools) != 6 || res.Tools[0].Name != "connect_session" {
		t.Fatalf("list over HTTP: %v (%d tools)", err, len(res.Tools))
	}
}

func TestHTTPDeleteThen404(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	c := hh.client(true)
	id := c.GetSessionId()
	if out := callOn(t, c, "connect_session", map[string]any{"token": tokA}, nil); out.IsError {
		t.Fatal(out.Text)
	}
	if hh.h.Executor().Bindings().Len() != 1 {
		t.Fatal("no binding")
	}
	if r := hh.raw(http.MethodDelete, id, "", nil); r.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %d", r.StatusCode)
	}
	if r := hh.raw(http.MethodPost, id, listBody, nil); r.StatusCode != http.StatusNotFound {
		t.Fatalf("after DELETE: %d", r.StatusCode)
	}
	if n := hh.h.Executor().Bindings().Len(); n != 0 {
		t.Fatalf("%d bindings survive the session", n)
	}
	if r := hh.raw(http.MethodGet, "", "", nil); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("GET without session: %d", r.StatusCode)
	}
	if r := hh.raw(http.MethodDelete, "", "", nil); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("DELETE without session: %d", r.StatusCode)
	}
	// Every method answers a gone or unknown id 404 in JSON (a GET used to
	// open a stream for it, a DELETE said 200, a POST answered text/plain).
	for _, tc := range []struct{ method, id string }{
		{http.MethodGet, id}, {http.MethodDelete, id}, {http.MethodPost, id},
		{http.MethodGet, "mcp-session-nope"}, {http.MethodDelete, "mcp-session-nope"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, tc.method, hh.srv.URL, strings.NewReader(listBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20251125)
		req.Header.Set("Mcp-Session-Id", tc.id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("%s %s: %v", tc.method, tc.id, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(b), `"session not found"`) {
			t.Fatalf("%s with session %s: %d %s %s, want 404 JSON session not found", tc.method, tc.id, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
	}
}

func TestHTTPCapacity(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.MaxSessions = 2; c.MaxUnauthenticatedSessions = 16 })
	var ids []string
	for i := 0; i < 3; i++ {
		r := hh.raw(http.MethodPost, "", initBody, nil)
		if r.StatusCode != http.StatusOK {
			t.Fatalf("init %d: %d", i, r.StatusCode)
		}
		ids = append(ids, r.Header.Get("Mcp-Session-Id"))
	}
	// A full table makes room (the caller's own least recently used
	// session here) instead of refusing everyone.
	if n := hh.h.Sessions(); n != 2 {
		t.Fatalf("%d sessions, want 2", n)
	}
	if r := hh.raw(http.MethodPost, ids[0], listBody, nil); r.StatusCode != http.StatusNotFound {
		t.Fatalf("evicted session answered %d", r.StatusCode)
	}
}

func TestHTTPUnauthenticatedEvictedLRU(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.MaxUnauthenticatedSessions = 2 })
	var ids []string
	for i := 0; i < 3; i++ {
		r := hh.raw(http.MethodPost, "", initBody, nil)
		if r.StatusCode != http.StatusOK {
			t.Fatalf("init %d: %d", i, r.StatusCode)
		}
		ids = append(ids, r.Header.Get("Mcp-Session-Id"))
	}
	if r := hh.raw(http.MethodPost, ids[0], listBody, nil); r.StatusCode != http.StatusNotFound {
		t.Fatalf("evicted session answered %d", r.StatusCode)
	}
	if r := hh.raw(http.MethodPost, ids[2], listBody, nil); r.StatusCode != http.StatusOK {
		t.Fatalf("newest session answered %d", r.StatusCode)
	}
}

func TestHTTPPerTokenCap(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.MaxSessionsPerToken = 2 })
	var cs []*client.Client
	for i := 0; i < 3; i++ {
		c := hh.client(true)
		if out := callOn(t, c, "connect_session", map[string]any{"token": tokA}, nil); out.IsError {
			t.Fatal(out.Text)
		}
		cs = append(cs, c)
	}
	if n := hh.h.Sessions(); n != 2 {
		t.Fatalf("%d sessions, want 2", n)
	}
	if r := hh.raw(http.MethodPost, cs[0].GetSessionId(), listBody, nil); r.StatusCode != http.StatusNotFound {
		t.Fatalf("oldest session of the token answered %d", r.StatusCode)
	}
	if out := callOn(t, cs[2], "observe", nil, nil); out.IsError {
		t.Fatal(out.Text)
	}
}

func TestHTTPOrigin(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.AllowedOrigins = []string{"https://app.example"} })
	if r := hh.raw(http.MethodPost, "", initBody, map[string]string{"Origin": "https://evil.example"}); r.StatusCode != http.StatusForbidden {
		t.Fatalf("bad origin: %d", r.StatusCode)
	}
	if !hh.audit.has(audit.EventRefused, "code", "forbidden-origin") {
		t.Fatal("origin refusal not audited")
	}
	// The refusal says what to do.
	req, _ := http.NewRequest(http.MethodPost, hh.srv.URL, strings.NewReader(initBody))
	req.Header.Set("Origin", "https://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"forbidden-origin"`) || !strings.Contains(string(b), "--origins") {
		t.Fatalf("origin refusal %s: want a detail naming --origins", b)
	}
	if r := hh.raw(http.MethodPost, "", initBody, map[string]string{"Origin": "https://app.example"}); r.StatusCode != http.StatusOK {
		t.Fatalf("allowed origin: %d", r.StatusCode)
	}
	if r := hh.raw(http.MethodPost, "", initBody, map[string]string{"Host": "evil.example"}); r.StatusCode == http.StatusOK {
		t.Fatal("DNS rebinding protection is off")
	}
}

func TestHTTPCreateRateLimit(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.CreateRate = 0.001; c.CreateBurst = 1 })
	if r := hh.raw(http.MethodPost, "", initBody, nil); r.StatusCode != http.StatusOK {
		t.Fatalf("first: %d", r.StatusCode)
	}
	r := hh.raw(http.MethodPost, "", initBody, nil)
	if r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
		t.Fatalf("second: %d", r.StatusCode)
	}
	if !hh.audit.has(audit.EventRateLimited, "reason", "session-create") {
		t.Fatal("rate limit not audited")
	}
}

// Over /agent/mcp the executor encodes a result once and the response writer
// splices it into mcp-go's response: what a client receives is the same as
// without splicing (structuredContent, and the same JSON as text), in JSON
// and in SSE responses, in both eras, with no marker left.
func TestHTTPResultSpliced(t *testing.T) {
	t.Parallel()
	if !spliceable() {
		t.Fatal("mcp-go encodes the placeholder differently: splicing is off (update splice.go)")
	}
	hh := newHTTPHarness(t, nil)
	state := `{"todos":["a \"quoted\" one","<b>&</b>","é\u2028"],"n":1}`
	hh.lap.on("/observe", func(int, fakeCall) (any, error) {
		return json.RawMessage(`{"state":` + state + `,"actions":[],"description":{"name":"Todo"},"context":null,"health":{"connected":true}}`), nil
	})
	// wait_for_change sends a progress notification first, which turns the
	// response into an SSE stream; the fake LAP answers once the client has
	// it, so the result is written as an SSE event.
	progressed := make(chan struct{}, 1)
	hh.lap.on("/wait", func(int, fakeCall) (any, error) {
		<-progressed
		// A state unlike the one observed, so that the patch from the
		// model's view is longer than the state: the answer is stateAfter.
		return json.RawMessage(`{"status":"changed","stateAfter":{"w":` + state + `}}`), nil
	})
	for _, legacy := range []bool{false, true} {
		c := hh.client(legacy)
		c.OnNotification(func(n mcpgo.JSONRPCNotification) {
			if n.Method == "notifications/progress" {
				select {
				case progressed <- struct{}{}:
				default:
				}
			}
		})
		h := callOn(t, c, "connect_session", map[string]any{"token": tokA}, nil).SC["session"]
		for _, tool := range []string{"observe", "wait_for_change"} {
			req := mcpgo.CallToolRequest{}
			req.Params.Name = tool
			req.Params.Arguments = map[string]any{"session": h}
			if tool == "wait_for_change" {
				req.Params.Meta = &mcpgo.Meta{ProgressToken: "p"}
			}
			res, err := c.CallTool(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			tc, _ := mcpgo.AsTextContent(res.Content[0])
			if len(res.Content) != 1 || string(res.RawStructuredContent) != tc.Text || strings.Contains(tc.Text, splicePrefix) {
				t.Fatalf("legacy=%v: text %q, structuredContent %s", legacy, tc.Text, res.RawStructuredContent)
			}
			var got map[string]any
			key, want := "state", compactState(state)
			if tool == "wait_for_change" {
				key, want = "stateAfter", compactState(`{"w":`+state+`}`)
			}
			if json.Unmarshal(res.RawStructuredContent, &got) != nil || mcpJSON(got[key]) != want {
				t.Fatalf("legacy=%v: structuredContent %s", legacy, res.RawStructuredContent)
			}
		}
	}
}

func compactState(s string) string {
	var v any
	_ = json.Unmarshal([]byte(s), &v)
	return mcpJSON(v)
}

func TestSpliceApply(t *testing.T) {
	t.Parallel()
	sp := &splicer{}
	ph := sp.put([]byte(`{"a":"x"}`))
	m := ph.Content[0].(mcpgo.TextContent).Text
	in := []byte(`{"result":{"content":[{"type":"text","text":"` + m + `"}],"resultType":"complete"}}`)
	out, ok := sp.apply(in)
	if want := `{"result":{"content":[{"type":"text","text":"{\"a\":\"x\"}"}],"structuredContent":{"a":"x"},"resultType":"complete"}}`; !ok || string(out) != want {
		t.Fatalf("apply:\n got %s\nwant %s", out, want)
	}
	// used once; an unknown or forged marker passes through untouched
	if _, ok := sp.apply(in); ok {
		t.Fatal("a marker was spliced twice")
	}
	// an SSE event
	ph = sp.put([]byte(`[1]`))
	m = ph.Content[0].(mcpgo.TextContent).Text
	if out, ok := sp.apply([]byte("event: message\ndata: {\"content\":[{\"type\":\"text\",\"text\":\"" + m + "\"}]}\n\n")); !ok ||
		string(out) != "event: message\ndata: {\"content\":[{\"type\":\"text\",\"text\":\"[1]\"}],\"structuredContent\":[1]}\n\n" {
		t.Fatalf("SSE: %q", out)
	}
	forged := []byte(`{"text":"` + splicePrefix + `999"}`)
	if _, ok := sp.apply(forged); ok {
		t.Fatal("a forged marker was spliced")
	}
}
