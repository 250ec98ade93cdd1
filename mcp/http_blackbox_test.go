package mcp

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// What an outside tester of /agent/mcp met (docs/PROTOCOL.md "MCP endpoint"):
// each test sends what a client or a browser sends, over real HTTP.

// rawResp is one answer, read whole.
type rawResp struct {
	status int
	header http.Header
	body   string
}

func (hh *httpHarness) send(method, sessionID, body string, hdr map[string]string) rawResp {
	hh.t.Helper()
	req, _ := http.NewRequest(method, hh.srv.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		hh.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawResp{resp.StatusCode, resp.Header, string(b)}
}

// session initializes a legacy session over raw HTTP and returns its id.
func (hh *httpHarness) session() string {
	hh.t.Helper()
	r := hh.send("POST", "", initBody, nil)
	id := r.header.Get("Mcp-Session-Id")
	if r.status != 200 || id == "" {
		hh.t.Fatalf("initialize: %d %s", r.status, r.body)
	}
	hh.send("POST", id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, nil)
	return id
}

type rpcError struct {
	ID    any `json:"id"`
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func wantRPCError(t *testing.T, r rawResp, status, code int, contains string) rpcError {
	t.Helper()
	var e rpcError
	if r.status != status || json.Unmarshal([]byte(r.body), &e) != nil || e.Error.Code != code || !strings.Contains(e.Error.Message, contains) {
		t.Fatalf("want %d with JSON-RPC error %d containing %q, got %d %s %s", status, code, contains, r.status, r.header.Get("Content-Type"), r.body)
	}
	return e
}

// Any method but the three the transport defines was mcp-go's 404 "404 page
// not found" (text/plain): "no endpoint here".
func TestHTTPOtherMethods405(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	for _, m := range []string{"PUT", "PATCH"} {
		r := hh.send(m, "", listBody, nil)
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET, POST, DELETE, OPTIONS" ||
			!strings.Contains(r.body, `"code":"method-not-allowed"`) || !strings.Contains(r.body, "POST") {
			t.Fatalf("%s: %d Allow=%q %s", m, r.status, r.header.Get("Allow"), r.body)
		}
	}
}

// A GET without a session is the reference's 400 {"error":"mcp-session-id
// required"} for a client; a browser that opened the banner's URL is also
// told what the URL is for.
func TestHTTPGetWithoutSession(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	if r := hh.send("GET", "", "", nil); r.status != http.StatusBadRequest || r.body != `{"error":"mcp-session-id required"}`+"\n" {
		t.Fatalf("client GET: %d %q", r.status, r.body)
	}
	r := hh.send("GET", "", "", map[string]string{"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"})
	var body struct{ Error, Detail string }
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || r.status != http.StatusBadRequest ||
		body.Error != "mcp-session-id required" || !strings.Contains(body.Detail, "MCP client") {
		t.Fatalf("browser GET: %d %s", r.status, r.body)
	}
}

// A page on an origin of --origins could not use the endpoint: every MCP
// request is a JSON POST, which a browser preflights (OPTIONS was 404), and
// the page could not read Mcp-Session-Id from the answer.
func TestHTTPCORSForAllowedOrigins(t *testing.T) {
	t.Parallel()
	const app = "http://app.example"
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.AllowedOrigins = []string{app} })

	pre := hh.send("OPTIONS", "", "", map[string]string{"Origin": app, "Access-Control-Request-Method": "POST",
		"Access-Control-Request-Headers": "content-type, mcp-session-id, mcp-protocol-version"})
	if pre.status != http.StatusNoContent || pre.header.Get("Access-Control-Allow-Origin") != app {
		t.Fatalf("preflight: %d %v", pre.status, pre.header)
	}
	for _, h := range []string{"Content-Type", "Mcp-Session-Id", "MCP-Protocol-Version"} {
		if !strings.Contains(pre.header.Get("Access-Control-Allow-Headers"), h) {
			t.Fatalf("preflight allows headers %q, not %s", pre.header.Get("Access-Control-Allow-Headers"), h)
		}
	}
	if !strings.Contains(pre.header.Get("Access-Control-Allow-Methods"), "POST") {
		t.Fatalf("preflight methods %q", pre.header.Get("Access-Control-Allow-Methods"))
	}

	init := hh.send("POST", "", initBody, map[string]string{"Origin": app})
	if init.status != 200 || init.header.Get("Access-Control-Allow-Origin") != app ||
		!strings.Contains(init.header.Get("Access-Control-Expose-Headers"), "Mcp-Session-Id") {
		t.Fatalf("cross-origin initialize: %d %v", init.status, init.header)
	}

	// A foreign origin is still refused, preflight included; a client
	// without an Origin gets no CORS headers.
	if r := hh.send("OPTIONS", "", "", map[string]string{"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}); r.status != http.StatusForbidden || r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("foreign preflight: %d %v", r.status, r.header)
	}
	if r := hh.send("POST", "", initBody, nil); r.status != 200 || r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("no Origin: %d %v", r.status, r.header)
	}
	// Look-alikes of the allowed origin (the outside security review's
	// probes) are foreign too, and no answer ever allows credentials.
	for _, o := range []string{"null", "http://app.example.evil.example", "http://evilapp.example", "https://app.example",
		"http://app.example:8080", "http://app.example.", "http://app.example/", "http://app.example, http://evil.example"} {
		if r := hh.send("OPTIONS", "", "", map[string]string{"Origin": o, "Access-Control-Request-Method": "POST"}); r.status != http.StatusForbidden || r.header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("look-alike origin %q: %d %v", o, r.status, r.header)
		}
	}
	if pre.header.Get("Access-Control-Allow-Credentials") != "" || init.header.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("credentials allowed: %v %v", pre.header, init.header)
	}
}

// A batch or a JSON value that is not an object was mcp-go's -32700
// "request body is not valid json": the JSON is valid, the request is not.
func TestHTTPBatchAndNonObjectAreInvalidRequests(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	sid := hh.session()
	wantRPCError(t, hh.send("POST", sid, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, nil), 400, -32600, "batches are not supported: send each request in its own POST")
	wantRPCError(t, hh.send("POST", sid, ` 42`, nil), 400, -32600, "one JSON-RPC message object")
	// Broken JSON is still a parse error.
	wantRPCError(t, hh.send("POST", sid, `{"jsonrpc":"2.0","id":1,`, nil), 400, -32700, "")
	// The session still works.
	if r := hh.send("POST", sid, `{"jsonrpc":"2.0","id":3,"method":"ping"}`, nil); r.status != 200 || !strings.Contains(r.body, `"result":{}`) {
		t.Fatalf("ping after: %d %s", r.status, r.body)
	}
}

// A legacy request without Mcp-Session-Id was mcp-go's 404 "Invalid session
// ID" (text/plain), which tells a client that its session expired; the spec
// asks 400 of a server that requires sessions.
func TestHTTPLegacyPostWithoutSession400(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	e := wantRPCError(t, hh.send("POST", "", `{"jsonrpc":"2.0","id":"a1","method":"tools/list"}`, nil), 400, -32600, "Mcp-Session-Id header required: send initialize first")
	if e.ID != "a1" {
		t.Fatalf("id %v", e.ID)
	}
	// Without a version header too (a client that has not negotiated).
	wantRPCError(t, hh.send("POST", "", listBody, map[string]string{"MCP-Protocol-Version": ""}), 400, -32600, "Mcp-Session-Id")
	// initialize still opens a session, and a modern client needs none.
	hh.session()
	modern := hh.client(false)
	if _, err := modern.ListTools(context.Background(), mcpgo.ListToolsRequest{}); err != nil {
		t.Fatal(err)
	}
}

// A call its client cancelled (notifications/cancelled) answered "network:
// lapd is unreachable …": for logs, metrics and any client that reads it,
// the call was cancelled, nothing failed. Both ways a tools/call is served.
func TestHTTPCancelledCallSaysCancelled(t *testing.T) {
	t.Parallel()
	for _, fast := range []bool{true, false} {
		name := "mcp-go"
		if fast {
			name = "fast-path"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bl := &waitBlockingLAP{fakeLAP: newFakeLAP(), entered: make(chan struct{}, 1)}
			hh := newHTTPHarness(t, func(c *HTTPConfig) { c.Client = bl; c.DisableFastPath = !fast })
			sid := hh.session()
			if r := hh.send("POST", sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"connect_session","arguments":{"token":"`+tokA+`"}}}`, nil); r.status != 200 || strings.Contains(r.body, `"isError":true`) {
				t.Fatalf("connect: %s", r.body)
			}
			done := make(chan rawResp, 1)
			go func() {
				done <- hh.send("POST", sid, `{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"wait_for_change","arguments":{"timeoutMs":60000}}}`, nil)
			}()
			<-bl.entered
			if r := hh.send("POST", sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":77,"reason":"user stopped"}}`, nil); r.status != http.StatusAccepted {
				t.Fatalf("cancel: %d %s", r.status, r.body)
			}
			r := <-done
			var res struct {
				Result struct {
					IsError bool `json:"isError"`
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
					SC struct {
						Error struct{ Code string } `json:"error"`
					} `json:"structuredContent"`
				} `json:"result"`
			}
			if err := json.Unmarshal([]byte(r.body), &res); err != nil || !res.Result.IsError || res.Result.SC.Error.Code != CodeCancelled ||
				len(res.Result.Content) == 0 || !strings.HasPrefix(res.Result.Content[0].Text, "cancelled: the client cancelled this call") {
				t.Fatalf("cancelled call answered %d %s", r.status, r.body)
			}
		})
	}
}

// Argument errors a model met that did not say what to do.
func TestHTTPArgumentErrorsSayWhatToDo(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.Tools = ToolsAll })
	c := hh.client(true)
	// Before any connect_session: nothing to disconnect, and no empty
	// "session" in the answer.
	out := callOn(t, c, "disconnect_session", nil, nil)
	if out.IsError || out.SC["status"] != "not-connected" {
		t.Fatalf("disconnect before connect: %s", out.Text)
	}
	if _, ok := out.SC["session"]; ok {
		t.Fatalf("disconnect before connect carries an empty session: %s", out.Text)
	}
	if out := callOn(t, c, "connect_session", map[string]any{"token": tokA}, nil); out.IsError {
		t.Fatal(out.Text)
	}
	// send_message without msg or msgs said "…, not both".
	wantError(t, callOn(t, c, "send_message", nil, nil), CodeInvalidArguments, "msg or msgs is required")
	wantError(t, callOn(t, c, "send_message", map[string]any{"msg": map[string]any{"type": "a"}, "msgs": []any{map[string]any{"type": "a"}}}, nil), CodeInvalidArguments, "not both")
	// An empty narration went to LAP and came back "invalid: … text required".
	wantError(t, callOn(t, c, "narrate", map[string]any{"text": "  "}, nil), CodeInvalidArguments, "text must not be empty: pass one short line")
	if n := len(hh.lap.callsTo("/narrate")); n != 0 {
		t.Fatalf("empty narration reached LAP (%d calls)", n)
	}
}

// The reference's bridge takes connect_session {url, token}, and models
// send that shape to the endpoint too (the reference's endpoint drops the
// url); lapd's endpoint refused it as an unknown argument.
func TestHTTPConnectWithBridgeShape(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	c := hh.client(false)
	out := callOn(t, c, "connect_session", map[string]any{"url": "http://localhost:8787/agent/lap/v1", "token": tokA}, nil)
	if out.IsError || out.SC["status"] != "connected" {
		t.Fatalf("connect_session {url, token}: %s", out.Text)
	}
	if calls := hh.lap.callsTo("/observe"); len(calls) != 1 || calls[0].Base != "" || calls[0].Token != tokA {
		t.Fatalf("LAP calls %+v", calls)
	}
	// Still listed as line, token, verbose; any other unknown argument is refused.
	wantError(t, callOn(t, c, "connect_session", map[string]any{"uri": "x", "token": tokA}, nil), CodeInvalidArguments, "unknown argument(s) uri")
}

// openStream opens a session's GET stream and returns its body once the
// headers arrived.
func (hh *httpHarness) openStream(ctx context.Context, sid string) io.ReadCloser {
	hh.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, hh.srv.URL, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		hh.t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		hh.t.Fatalf("GET stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp.Body
}

// streamEnds waits for body to end; it fails the test if it is still open
// when ctx ends (the stream would otherwise stay open for ever).
func streamEnds(t *testing.T, ctx context.Context, body io.ReadCloser, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, body); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("%s: the session's GET stream is still open", what)
	}
	body.Close()
}

// One session's GET streams cost nothing while they last: 256 of them, from
// one initialize, held every connection a loopback client may keep, and
// every other local client got 503 (found against lapd serve). A session
// has one stream: a new one ends the one before.
func TestHTTPOneStreamPerSession(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sid := hh.session()
	first := hh.openStream(ctx, sid)
	second := hh.openStream(ctx, sid)
	streamEnds(t, ctx, first, "after a second GET on its session")
	// The second one is open until its session goes.
	if r := hh.send("DELETE", sid, "", nil); r.status != 200 {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	streamEnds(t, ctx, second, "after DELETE")
}

// A DELETEd or evicted session kept its GET stream open (mcp-go ends one
// only when the client leaves or the server stops): a connection and a
// goroutine per stream, for ever, after the session was gone.
func TestHTTPStreamEndsWithItsSession(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.MaxUnauthenticatedSessions = 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	sid := hh.session()
	body := hh.openStream(ctx, sid)
	if r := hh.send("DELETE", sid, "", nil); r.status != 200 {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	streamEnds(t, ctx, body, "after DELETE")

	// Evicted: one session that never connected is allowed, the next
	// initialize evicts it.
	first := hh.session()
	body = hh.openStream(ctx, first)
	hh.session()
	streamEnds(t, ctx, body, "after eviction")
	if r := hh.send("GET", first, "", map[string]string{"Accept": "text/event-stream"}); r.status != 404 {
		t.Fatalf("GET on the evicted session: %d %s", r.status, r.body)
	}
}
