package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// The /agent/mcp fast path must answer what mcp-go answers. Each test
// below drives two endpoints with the same scripted LAP, one with the fast
// path (the default) and one with DisableFastPath, sends every request to
// both and compares status, Content-Type and body byte for byte, after
// replacing what is random on each side (session handles, MCP session ids,
// generated idempotency keys). It also checks which requests the fast path
// took: the ones it must take, and the ones it must leave to mcp-go.

var randomParts = regexp.MustCompile(`s_[a-z2-7]{16}|mcp-session-[0-9a-f]{32}|mcp_[a-z2-7]{20}`)

func normalise(b []byte) string {
	return randomParts.ReplaceAllStringFunc(string(b), func(s string) string {
		switch {
		case strings.HasPrefix(s, "s_"):
			return "s_HANDLE"
		case strings.HasPrefix(s, "mcp-session-"):
			return "mcp-session-ID"
		}
		return "mcp_KEY"
	})
}

// diffSide is one of the two endpoints and what a client of it holds.
type diffSide struct {
	hh     *httpHarness
	obs    *obsRec
	logs   *logRec
	sid    string // legacy MCP session
	handle string // from connect_session
}

type diffReply struct {
	status int
	ctype  string
	header string // every response header but Date, normalised
	frame  string // Content-Length and Transfer-Encoding as the client saw them
	body   []byte
}

// obsRec is an Observer (the metrics instruments) that records each call.
type obsRec struct {
	mu    sync.Mutex
	calls []string
}

func (o *obsRec) ToolCall(tool, era string, _ time.Duration, isError bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.calls = append(o.calls, fmt.Sprintf("%s %s isError=%v", tool, era, isError))
}

func (o *obsRec) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.calls)
}

// logRec records every log line (all levels) but its durations.
type logRec struct {
	mu    sync.Mutex
	lines []string
}

type logRecHandler struct {
	rec   *logRec
	attrs []slog.Attr
}

func (h logRecHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logRecHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	add := func(a slog.Attr) bool {
		if a.Key != "duration_s" {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	h.rec.lines = append(h.rec.lines, normalise([]byte(b.String())))
	return nil
}

func (h logRecHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logRecHandler{rec: h.rec, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h logRecHandler) WithGroup(string) slog.Handler { return h }

func (l *logRec) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

func (s *diffSide) post(t *testing.T, body string, hdr map[string]string) diffReply {
	t.Helper()
	body = strings.ReplaceAll(body, "{{H}}", s.handle)
	req, _ := http.NewRequest(http.MethodPost, s.hh.srv.URL, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, strings.ReplaceAll(v, "{{SID}}", s.sid))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	h := resp.Header.Clone()
	h.Del("Date")
	var hb bytes.Buffer
	_ = h.Write(&hb)
	return diffReply{
		status: resp.StatusCode,
		ctype:  resp.Header.Get("Content-Type"),
		header: normalise(hb.Bytes()),
		frame:  fmt.Sprintf("Content-Length %d, Transfer-Encoding %q", resp.ContentLength, resp.TransferEncoding),
		body:   b,
	}
}

type diffPair struct {
	t          *testing.T
	fast, slow *diffSide
}

func newDiffPair(t *testing.T, script func(*fakeLAP), mutate func(*HTTPConfig)) *diffPair {
	t.Helper()
	mk := func(disable bool) *diffSide {
		s := &diffSide{obs: &obsRec{}, logs: &logRec{}}
		s.hh = newHTTPHarness(t, func(c *HTTPConfig) {
			c.DisableFastPath = disable
			c.Tools = ToolsAll
			c.Observer = s.obs
			c.Logger = slog.New(logRecHandler{rec: s.logs})
			if mutate != nil {
				mutate(c)
			}
		})
		if script != nil {
			script(s.hh.lap)
		}
		return s
	}
	p := &diffPair{t: t, fast: mk(false), slow: mk(true)}
	t.Cleanup(p.compareEffects)
	if p.fast.hh.h.fast == nil {
		t.Fatal("the fast path is off")
	}
	if p.slow.hh.h.fast != nil {
		t.Fatal("DisableFastPath left the fast path on")
	}
	return p
}

func legacyHdr() map[string]string {
	return map[string]string{"MCP-Protocol-Version": mcpgo.ProtocolVersion20251125, "Mcp-Session-Id": "{{SID}}"}
}

func modernHdr(name string) map[string]string {
	return map[string]string{"MCP-Protocol-Version": mcpgo.ProtocolVersion20260728, "Mcp-Method": "tools/call", "Mcp-Name": name}
}

// withHdr returns h with k: v added.
func withHdr(h map[string]string, k, v string) map[string]string {
	out := maps.Clone(h)
	out[k] = v
	return out
}

const modernMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`

// initLegacy opens a legacy session on both sides.
func (p *diffPair) initLegacy() {
	p.t.Helper()
	p.fast.initLegacy(p.t)
	p.slow.initLegacy(p.t)
}

// initLegacy opens a legacy session.
func (s *diffSide) initLegacy(t *testing.T) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.hh.srv.URL, strings.NewReader(initBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20251125)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s.sid = resp.Header.Get("Mcp-Session-Id")
	if r := s.post(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, legacyHdr()); r.status != http.StatusAccepted {
		t.Fatalf("initialized: %d", r.status)
	}
}

// send posts body to both sides, compares the replies and checks whether
// the fast path took it. It returns the fast side's reply.
func (p *diffPair) send(name, body string, hdr map[string]string, wantFast bool) diffReply {
	p.t.Helper()
	n0 := p.fast.hh.h.fast.served.Load()
	f := p.fast.post(p.t, body, hdr)
	s := p.slow.post(p.t, body, hdr)
	if took := p.fast.hh.h.fast.served.Load() > n0; took != wantFast {
		p.t.Errorf("%s: fast path took it: %v, want %v (reply %d %.300s)", name, took, wantFast, f.status, f.body)
	}
	if f.status != s.status || f.header != s.header || f.frame != s.frame || normalise(f.body) != normalise(s.body) {
		p.t.Errorf("%s: fast path answered\n  %d %s\n%s  %s\nmcp-go answered\n  %d %s\n%s  %s", name, f.status, f.frame, f.header, f.body, s.status, s.frame, s.header, s.body)
	}
	return f
}

// compareEffects compares what both sides did besides answering: the LAP
// calls they made (route, token, body, request id), the metrics
// instruments' records, the log lines and the audit entries.
func (p *diffPair) compareEffects() {
	p.t.Helper()
	lapCalls := func(s *diffSide) []string {
		s.hh.lap.mu.Lock()
		defer s.hh.lap.mu.Unlock()
		var out []string
		for _, c := range s.hh.lap.calls {
			b, _ := json.Marshal(c.Body)
			rid := c.RID
			if rid == "" {
				rid = "(none)"
			} else if !strings.HasPrefix(rid, "test-") {
				rid = "(generated)"
			}
			out = append(out, normalise([]byte(fmt.Sprintf("%s %s %s rid=%s %s", c.Base, c.Token, c.Route, rid, b))))
		}
		return out
	}
	auditEntries := func(s *diffSide) []string {
		s.hh.audit.mu.Lock()
		defer s.hh.audit.mu.Unlock()
		var out []string
		for _, e := range s.hh.audit.es {
			b, _ := json.Marshal(e.Detail)
			out = append(out, e.Event+" "+normalise(b))
		}
		return out
	}
	for _, c := range []struct {
		what       string
		fast, slow []string
	}{
		{"LAP calls", lapCalls(p.fast), lapCalls(p.slow)},
		{"metrics", p.fast.obs.list(), p.slow.obs.list()},
		{"log lines", p.fast.logs.list(), p.slow.logs.list()},
		{"audit entries", auditEntries(p.fast), auditEntries(p.slow)},
	} {
		if !slices.Equal(c.fast, c.slow) {
			p.t.Errorf("%s differ:\nfast path:\n  %s\nmcp-go:\n  %s", c.what, strings.Join(c.fast, "\n  "), strings.Join(c.slow, "\n  "))
		}
	}
}

// connect calls connect_session on both sides and keeps each side's handle.
func (p *diffPair) connect(name, body string, hdr map[string]string, wantFast bool) {
	p.t.Helper()
	p.send(name, body, hdr, wantFast)
	for _, s := range []*diffSide{p.fast, p.slow} {
		hs := s.hh.h.Executor().Bindings()
		hs.mu.Lock()
		for h, b := range hs.m {
			if s.handle == "" || b.CreatedAt.After(hs.m[s.handle].CreatedAt) {
				s.handle = h
			}
		}
		hs.mu.Unlock()
	}
}

func scriptLAP(f *fakeLAP) {
	f.on("/observe", observeWith(twoActions))
	f.on("/message", func(n int, c fakeCall) (any, error) {
		switch c.Body["msg"].(map[string]any)["type"] {
		case "clearAll":
			return json.RawMessage(`{"status":"rejected","reason":"human-only","detail":"only the user may clear"}`), nil
		case "slow":
			return nil, errors.New("connection refused")
		}
		return dispatched(`[{"op":"add","path":"/todos/0","value":"<b>x</b> & \"y\"\u2028"}]`, twoActions), nil
	})
	f.on("/state", func(n int, _ fakeCall) (any, error) {
		if n == 1 {
			return json.RawMessage(`{"state":{"todos":["é","\u0000","<script>"]}}`), nil
		}
		return json.RawMessage(`{"state":` + bigState() + `}`), nil
	})
}

// bigState is about 10 KiB of state (net/http sends it chunked) with
// markup, escapes and multi-byte characters.
func bigState() string {
	var todos []string
	for i := 0; len(strings.Join(todos, ",")) < 10<<10; i++ {
		todos = append(todos, fmt.Sprintf(`{"id":%d,"title":"todo <%d> & \"é\u2028\\ \t","done":%v}`, i, i, i%2 == 0))
	}
	return `{"todos":[` + strings.Join(todos, ",") + `]}`
}

func TestFastPathMatchesMCPGoLegacy(t *testing.T) {
	t.Parallel()
	p := newDiffPair(t, scriptLAP, nil)
	p.initLegacy()
	h := legacyHdr()
	call := func(id, name, args string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + name + `","arguments":` + args + `}}`
	}
	p.send("observe unbound", call("2", "observe", `{}`), h, true)
	p.connect("connect_session", call("3", "connect_session", `{"token":"`+tokA+`"}`), h, true)
	p.send("observe default binding", call("4", "observe", `{}`), h, true)
	p.send("observe by handle, string id", call(`"abc-1"`, "observe", `{"session":"{{H}}"}`), h, true)
	p.send("observe verbose", call("5", "observe", `{"verbose":true}`), h, true)
	p.send("a request id", call("5.5", "observe", `{}`), withHdr(h, "X-Request-Id", "test-rid-1"), true)
	p.send("an invalid request id", call("5.6", "observe", `{}`), withHdr(h, "X-Request-Id", "test rid with spaces, and over any sane length: 0123456789012345678901234567890123456789012345678901234567890123456789"), true)
	p.send("unknown argument", call("6", "observe", `{"nope":1}`), h, true)
	p.send("arguments null", call("7", "observe", `null`), h, true)
	p.send("arguments an array", call("8", "observe", `[1]`), h, true)
	p.send("no arguments", `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"observe"}}`, h, true)
	p.send("send_message dispatched", call("10", "send_message", `{"msg":{"type":"addTodo","title":"<b>"},"idempotencyKey":"k1"}`), h, true)
	p.send("send_message rejected", call("11", "send_message", `{"msg":{"type":"clearAll"}}`), h, true)
	p.send("send_message batch", call("12", "send_message", `{"msgs":[{"type":"addTodo"},{"type":"clearAll"},{"type":"addTodo"}]}`), h, true)
	p.send("send_message failing", call("13", "send_message", `{"msg":{"type":"slow"},"idempotencyKey":"k2"}`), h, true)
	p.send("get_state", call("14", "get_state", `{}`), h, true)
	if r := p.send("get_state, 10 KiB", call("14.5", "get_state", `{}`), h, true); r.frame != `Content-Length -1, Transfer-Encoding ["chunked"]` {
		t.Errorf("a 10 KiB result: %s, want it chunked", r.frame)
	}
	p.send("narrate", call("15", "narrate", `{"text":"hello"}`), h, true)
	p.send("id 1.5", call("1.5", "observe", `{}`), h, true)
	p.send("id -7", call("-7", "observe", `{}`), h, true)
	p.send("id 1e20", call("1e20", "observe", `{}`), h, true)
	p.send("id with markup", call(`"<a&b>\u2028"`, "observe", `{}`), h, true)
	p.send("escaped member name", `{"jsonrpc":"2.0","id":16,"\u006dethod":"tools/call","params":{"name":"observe"}}`, h, true)
	p.send("params in another case", `{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"Name":"observe"}}`, h, true)
	p.send("whitespace", "\n{ \"jsonrpc\" : \"2.0\" , \"id\" : 18 , \"method\" : \"tools/call\" , \"params\" : { \"name\" : \"observe\" } }\n", h, true)
	p.send("a legacy _meta", `{"jsonrpc":"2.0","id":19,"method":"tools/call","params":{"name":"observe","_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25","trace":"x"}}}`, h, true)
	p.send("no protocol-version header", call("20", "observe", `{}`), map[string]string{"Mcp-Session-Id": "{{SID}}"}, true)
	p.send("disconnect_session", call("21", "disconnect_session", `{}`), h, true)
	p.send("observe after disconnect", call("22", "observe", `{}`), h, true)

	// left to mcp-go
	p.send("unknown tool", call("30", "nope", `{}`), h, false)
	p.send("another method", `{"jsonrpc":"2.0","id":31,"method":"tools/list","params":{}}`, h, false)
	p.send("a member twice", `{"jsonrpc":"2.0","id":32,"id":33,"method":"tools/call","params":{"name":"observe"}}`, h, false)
	p.send("a member in another case", `{"jsonrpc":"2.0","ID":34,"method":"tools/call","params":{"name":"observe"}}`, h, false)
	p.send("an extra member", `{"jsonrpc":"2.0","id":35,"method":"tools/call","params":{"name":"observe"},"x":1}`, h, false)
	p.send("jsonrpc 1.0", `{"jsonrpc":"1.0","id":36,"method":"tools/call","params":{"name":"observe"}}`, h, false)
	p.send("id null", `{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"observe"}}`, h, false)
	p.send("id true", `{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"observe"}}`, h, false)
	p.send("not JSON", `{"jsonrpc":"2.0","id":37,"method":"tools/call","params":{"name":"observe",}}`, h, false)
	p.send("name not a string", `{"jsonrpc":"2.0","id":38,"method":"tools/call","params":{"name":7}}`, h, false)
	p.send("a task", `{"jsonrpc":"2.0","id":39,"method":"tools/call","params":{"name":"observe","task":{}}}`, h, false)
	p.send("text/plain", call("40", "observe", `{}`), map[string]string{"Content-Type": "text/plain", "MCP-Protocol-Version": "2025-11-25", "Mcp-Session-Id": "{{SID}}"}, false)
	p.send("unknown protocol version", call("41", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "1999-01-01", "Mcp-Session-Id": "{{SID}}"}, false)
	p.send("no session", call("42", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "2025-11-25"}, false)
	p.send("unknown session", call("43", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "2025-11-25", "Mcp-Session-Id": "mcp-session-00000000000000000000000000000000"}, false)
	p.send("a modern header on a legacy body", call("44", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Session-Id": "{{SID}}"}, false)

	// A progress token: progress is sent as SSE events, by mcp-go; and from
	// then on mcp-go answers this session in SSE, so the fast path leaves
	// it alone.
	p.send("progress token", `{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"connect_session","arguments":{"token":"`+tokB+`"},"_meta":{"progressToken":"p1"}}}`, h, false)
	r := p.send("after a notification", call("51", "observe", `{"session":"{{H}}"}`), h, false)
	if !strings.HasPrefix(r.ctype, "text/event-stream") {
		t.Errorf("after a notification mcp-go answers in SSE, got %q", r.ctype)
	}

	// DELETE ends the session: 404 from mcp-go, not a fast answer.
	for _, s := range []*diffSide{p.fast, p.slow} {
		req, _ := http.NewRequest(http.MethodDelete, s.hh.srv.URL, nil)
		req.Header.Set("Mcp-Session-Id", s.sid)
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	p.send("after DELETE", call("60", "observe", `{}`), h, false)
}

func TestFastPathMatchesMCPGoModern(t *testing.T) {
	t.Parallel()
	p := newDiffPair(t, scriptLAP, nil)
	call := func(id, name, args string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"` + name + `","arguments":` + args + `,` + modernMeta + `}}`
	}
	p.send("observe without a session", call("1", "observe", `{}`), modernHdr("observe"), true)
	p.connect("connect_session", call("2", "connect_session", `{"token":"`+tokA+`"}`), modernHdr("connect_session"), true)
	p.send("observe", call("3", "observe", `{"session":"{{H}}"}`), modernHdr("observe"), true)
	p.send("observe, string id", call(`"x"`, "observe", `{"session":"{{H}}","verbose":true}`), modernHdr("observe"), true)
	p.send("send_message", call("4", "send_message", `{"session":"{{H}}","msg":{"type":"addTodo"},"idempotencyKey":"k"}`), withHdr(modernHdr("send_message"), "X-Request-Id", "test-rid-2"), true)
	p.send("send_message failing", call("5", "send_message", `{"session":"{{H}}","msg":{"type":"slow"}}`), modernHdr("send_message"), true)
	p.send("invalid arguments", call("6", "observe", `{"session":7}`), modernHdr("observe"), true)
	p.send("client info and log level", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_state","arguments":{"session":"{{H}}"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}},"io.modelcontextprotocol/clientInfo":{"name":"c","version":"1"},"io.modelcontextprotocol/logLevel":"debug"}}}`, modernHdr("get_state"), true)
	p.send("a session id is ignored", call("8", "observe", `{"session":"{{H}}"}`), map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "observe", "Mcp-Session-Id": "whatever"}, true)

	// left to mcp-go
	p.send("no Mcp-Name", call("20", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"}, false)
	p.send("Mcp-Name of another tool", call("21", "observe", `{}`), modernHdr("narrate"), false)
	p.send("no Mcp-Method", call("22", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Name": "observe"}, false)
	p.send("no protocol-version header", call("23", "observe", `{}`), map[string]string{"Mcp-Method": "tools/call", "Mcp-Name": "observe"}, false)
	p.send("header and _meta disagree", call("24", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "2025-11-25", "Mcp-Method": "tools/call", "Mcp-Name": "observe"}, false)
	p.send("no capabilities", `{"jsonrpc":"2.0","id":25,"method":"tools/call","params":{"name":"observe","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, modernHdr("observe"), false)
	p.send("a Last-Event-ID", call("26", "observe", `{}`), map[string]string{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "observe", "Last-Event-ID": "1"}, false)
	p.send("a modern header, no _meta", `{"jsonrpc":"2.0","id":27,"method":"tools/call","params":{"name":"observe"}}`, modernHdr("observe"), false)
	p.send("a progress token", `{"jsonrpc":"2.0","id":28,"method":"tools/call","params":{"name":"observe","arguments":{"session":"{{H}}"},"_meta":{"progressToken":1,"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`, modernHdr("observe"), false)
}

// A panic in a tool handler is a JSON-RPC internal error, as mcp-go's
// recovery middleware makes it.
func TestFastPathMatchesMCPGoPanic(t *testing.T) {
	t.Parallel()
	p := newDiffPair(t, func(f *fakeLAP) {
		f.on("/context", func(int, fakeCall) (any, error) { panic("boom") })
	}, nil)
	p.initLegacy()
	p.connect("connect", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"connect_session","arguments":{"token":"`+tokA+`"}}}`, legacyHdr(), true)
	r := p.send("panic", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"describe_context","arguments":{}}}`, legacyHdr(), true)
	if !bytes.Contains(r.body, []byte(`"code":-32603`)) || !bytes.Contains(r.body, []byte("panic recovered in describe_context tool handler: boom")) {
		t.Fatalf("panic: %s", r.body)
	}
	p.send("panic, modern", `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"describe_context","arguments":{"session":"{{H}}"},`+modernMeta+`}}`, modernHdr("describe_context"), true)
}

// waitBlockingLAP holds /wait until the call's context ends.
type waitBlockingLAP struct {
	*fakeLAP
	entered chan struct{}
}

func (b *waitBlockingLAP) Call(ctx context.Context, base, token, route string, body any) (json.RawMessage, error) {
	if route == "/wait" {
		b.entered <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return b.fakeLAP.Call(ctx, base, token, route, body)
}

// notifications/cancelled ends a call the fast path runs, as it ends one
// mcp-go runs; both then answer the same result.
func TestFastPathCancelled(t *testing.T) {
	t.Parallel()
	var replies []string
	for _, disable := range []bool{false, true} {
		bl := &waitBlockingLAP{fakeLAP: newFakeLAP(), entered: make(chan struct{}, 1)}
		hh := newHTTPHarness(t, func(c *HTTPConfig) { c.DisableFastPath = disable; c.Client = bl })
		s := &diffSide{hh: hh}
		// legacy session, connected
		req, _ := http.NewRequest(http.MethodPost, hh.srv.URL, strings.NewReader(initBody))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s.sid = resp.Header.Get("Mcp-Session-Id")
		s.post(t, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"connect_session","arguments":{"token":"`+tokA+`"}}}`, legacyHdr())
		var wg sync.WaitGroup
		var got diffReply
		wg.Add(1)
		go func() {
			defer wg.Done()
			got = s.post(t, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"wait_for_change","arguments":{"timeoutMs":60000}}}`, legacyHdr())
		}()
		select {
		case <-bl.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("the call never reached LAP")
		}
		if r := s.post(t, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":9,"reason":"user"}}`, legacyHdr()); r.status != http.StatusAccepted {
			t.Fatalf("cancel: %d %s", r.status, r.body)
		}
		wg.Wait()
		if !bytes.Contains(got.body, []byte(`"isError":true`)) {
			t.Fatalf("cancelled call (fast path %v): %d %s", !disable, got.status, got.body)
		}
		replies = append(replies, normalise(got.body))
		if !disable && hh.h.fast.served.Load() < 2 {
			t.Fatal("the fast path did not take the call")
		}
	}
	if replies[0] != replies[1] {
		t.Fatalf("cancelled: fast path answered %s, mcp-go %s", replies[0], replies[1])
	}
}

// The fast path keeps its session view in step with mcp-go's and the table.
func TestFastPathForgetsEndedSessions(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.MaxSessions = 2; c.MaxUnauthenticatedSessions = 16 })
	count := func() int {
		n := 0
		hh.h.fast.sessions.Range(func(any, any) bool { n++; return true })
		return n
	}
	for range 4 {
		if r := hh.raw(http.MethodPost, "", initBody, nil); r.StatusCode != http.StatusOK {
			t.Fatalf("initialize: %d", r.StatusCode)
		}
	}
	if n := count(); n != 2 {
		t.Fatalf("fast path knows %d sessions, the table holds %d", n, hh.h.Sessions())
	}
}

// The probe captured mcp-go's own encoding: check the templates against a
// response built the way mcp-go builds it.
func TestFastPathTemplates(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	f := hh.h.fast
	sc := []byte(`{"a":"<x> \"q\"","b":[1,2]}`)
	got := f.legacy.appendSpliced(nil, []byte(`7`), sc)
	res := &mcpgo.CallToolResult{Content: []mcpgo.Content{mcpgo.NewTextContent(string(sc))}, StructuredContent: json.RawMessage(sc)}
	var want bytes.Buffer
	enc := json.NewEncoder(&want)
	enc.SetEscapeHTML(false) // appendJSONString leaves markup as it is (splice.go)
	if err := enc.Encode(mcpgo.NewJSONRPCResultResponse(mcpgo.NewRequestId(7), res)); err != nil {
		t.Fatal(err)
	}
	var g, w any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(want.Bytes(), &w) != nil || fmt.Sprint(g) != fmt.Sprint(w) {
		t.Fatalf("legacy template:\n%s\nwant the same JSON as\n%s", got, want.Bytes())
	}
	if !bytes.HasSuffix(got, []byte("\n")) {
		t.Fatalf("no newline at the end: %q", got)
	}
	mod := f.modern.appendSpliced(nil, []byte(`"i"`), sc)
	if !bytes.Contains(mod, []byte(`"resultType":"complete"`)) || !bytes.Contains(mod, []byte(`"io.modelcontextprotocol/serverInfo":{"name":"lapd"`)) {
		t.Fatalf("modern template: %s", mod)
	}
}

// FuzzParseToolCall: whatever envelope the fast path takes, mcp-go decodes
// the same way (the JSON is valid; jsonrpc, method and id as HandleMessage
// reads them; the params as its CallToolRequest and its era detection read
// them; the id encoded back as its responses encode it).
func FuzzParseToolCall(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"observe","arguments":{"session":"s_x"}}}`,
		`{"jsonrpc":"2.0","id":"a\u00e9","method":"tools/call","params":{"name":"observe","_meta":{"progressToken":null,"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`,
		`{ "params" : {"Name":"observe","NAME":"x","arguments":[1]} , "method":"tools/call","id":-0,"jsonrpc":"2.0"}`,
		`{"jsonrpc":"2.0","id":1e20,"method":"tools/call","params":{"name":"observe","arguments":null,"task":null}}`,
		`{"jsonrpc":"2.0","id":9007199254740993,"method":"tools/call","params":{"name":"observe"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"observe"}} x`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"observe"]}`,
		`{"jsonrpc":"2.0","id":1,"\u006dethod":"tools/call","params":{"name":"observe","_meta":{"a":1},"_META":{"b":2}}}`,
		`{"jsonrpc":"2.0","id":"\ud800","method":"tools/call","params":{"name":"obs\u0000erve"}}`,
		`{"jsonrpc":"2.0","id":"a<b>&c","method":"tools/call","params":{"name":"observe","arguments":{"x":[1,2.5e3,"y"]},"_meta":null}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"observe","arguments":{"s":"a\u00e9\n","n":-1.5E-3,"b":true,"f":false,"z":null,"o":{"k":{"k":1}},"s":"again","big":1e400},"_meta":{"progressToken":"p","x":{"y":[null]}}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"observe","arguments":"str","_meta":{"progressToken":null}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"observe","arguments":{"\u0041":"\ud800x"},"_meta":[1]}}`,
		`{"jsonrpc":"2.0","id":-0,"method":"tools/call","params":{"_meta":{"progressToken":7},"name":"x\xffy","arguments":null}}`,
		`{"jsonrpc":"2.0","id":123456789012345,"method":"tools/call","params":{"name":"observe","name":"other"}}`,
		`{"jsonrpc":"2.0","id":1234567890123456,"method":"tools/call","params":{"name":"observe","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":"plain id","method":"tools/call","params":{"name":"a\u0062c","arguments":{"a":1},"task":{"ttl":1}}}`,
		"{\"jsonrpc\":\"2.0\",\"id\":\"\x01\",\"method\":\"tools/call\",\"params\":{\"name\":\"ob\x7fs\"}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var c fastCall
		params, ok := parseToolCall(body, &c)
		if !ok {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("took invalid JSON %q", body)
		}
		// handlePost's first look and HandleMessage's base message
		var first struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result,omitempty"`
			Error  json.RawMessage `json:"error,omitempty"`
			Method mcpgo.MCPMethod `json:"method,omitempty"`
		}
		var base struct {
			JSONRPC string          `json:"jsonrpc"`
			Method  mcpgo.MCPMethod `json:"method"`
			ID      any             `json:"id,omitempty"`
			Result  any             `json:"result,omitempty"`
		}
		if err := json.Unmarshal(body, &first); err != nil || first.Result != nil || first.Error != nil || first.Method != mcpgo.MethodToolsCall {
			t.Fatalf("mcp-go's first look at %q: %v %+v", body, err, first)
		}
		if err := json.Unmarshal(body, &base); err != nil || base.JSONRPC != "2.0" || base.Method != mcpgo.MethodToolsCall || base.Result != nil {
			t.Fatalf("mcp-go's base message of %q: %v %+v", body, err, base)
		}
		if !reflect.DeepEqual(base.ID, c.id) || fmt.Sprint(base.ID) != fmt.Sprint(c.id) { // the in-flight key prints it
			t.Fatalf("id of %q: mcp-go %#v, fast path %#v", body, base.ID, c.id)
		}
		idJSON, _ := json.Marshal(mcpgo.NewRequestId(base.ID))
		if !bytes.Equal(idJSON, c.idJSON) {
			t.Fatalf("id of %q encoded: mcp-go %s, fast path %s", body, idJSON, c.idJSON)
		}
		// the request mcp-go hands the tool, and the _meta its era detection reads
		var req mcpgo.CallToolRequest
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatalf("mcp-go's request of %q: %v", body, err)
		}
		if !reflect.DeepEqual(req.Params, c.req.Params) {
			t.Fatalf("params of %q: mcp-go %#v, fast path %#v", body, req.Params, c.req.Params)
		}
		var wrapper struct {
			Params struct {
				Meta *mcpgo.Meta `json:"_meta"`
			} `json:"params"`
		}
		var w2 struct {
			Params json.RawMessage `json:"params"`
		}
		if json.Unmarshal(body, &wrapper) != nil || !reflect.DeepEqual(wrapper.Params.Meta, c.req.Params.Meta) {
			t.Fatalf("_meta of %q: mcp-go %#v, fast path %#v", body, wrapper.Params.Meta, c.req.Params.Meta)
		}
		if json.Unmarshal(body, &w2) != nil || !bytes.Equal(w2.Params, params) {
			t.Fatalf("params bytes of %q (the standard-header check reads them): mcp-go %s, fast path %s", body, w2.Params, params)
		}
		// the standard-header check reads the tool's name where mcp-go reads
		// the whole params
		if name, ok := mcpgo.ExtractHeaderName(mcpgo.MethodToolsCall, w2.Params); !ok || name != c.req.Params.Name {
			t.Fatalf("name of %q in the standard-header check: mcp-go %q %v, fast path %q", body, name, ok, c.req.Params.Name)
		}
	})
}

// The fast path mirrors what lapd's mcp-go server and transport do for a
// tools/call (fastpath.go, "Hooks and middlewares the fast path does not
// run"). This test fails when the package starts using a part of mcp-go the
// fast path does not mirror — an option (a middleware, hooks, an idle TTL,
// an event store, schema validation…) or a call that sends a notification
// or changes the tool list at run time — so that whoever adds it teaches
// the fast path (or its fallback) first, then extends the list here.
func TestFastPathMirrorsMCPGoUse(t *testing.T) {
	t.Parallel()
	mirrored := map[string]bool{
		// types, context helpers and constants the fast path reads the same way
		"ClientSession": true, "ClientSessionFromContext": true, "FilterSupportedVersions": true,
		"HeaderKeySessionID": true, "Hooks": true, "IsModernRequest": true, "MCPServer": true,
		"RequestProtocolInfo": true, "ServerFromContext": true, "ServerOption": true, "ServerTool": true,
		"SessionIdManager": true, "StreamableHTTPServer": true, "ToolHandlerFunc": true,
		"WithRequestProtocolInfo": true, "WithSupportedProtocolVersions": true,
		// constructors and options, each mirrored or without effect on a tools/call
		"NewMCPServer": true, "NewStdioServer": true, "NewStreamableHTTPServer": true,
		"WithDisableLocalhostProtection": true, // ServeHTTP's hostguard runs first either way
		"WithHooks":                      true, // only the fast path's own session hooks (NewHTTPHandler)
		"WithInstructions":               true, "WithTitle": true, "WithPromptCapabilities": true, "WithToolCapabilities": true,
		"WithLogger":                   true, // the mcp.request and mcp.tool lines: logRequest, call
		"WithRecovery":                 true, // call's recover
		"WithSessionIdManagerResolver": true, // accept validates with the same table
		"WithStateful":                 true, // legacy sessions: accept's session checks
		"WithStreamableHTTPLogger":     true, // tlog
		"WithToolFilter":               true, // lapd's filter only orders the list; a call passes it
		"WithWorkerPoolSize":           true, // the stdio server's, not the endpoint's
	}
	// Calls that send notifications or change tools at run time, and where
	// they are allowed.
	runtime := map[string]string{
		"SendNotificationToClient": "progress.go", // tells the fast path first (onNotify)
		"AddTools":                 "executor.go", // Register, before any session
		"AddPrompt":                "executor.go", // Register, before any session
		"AddTool":                  "fastpath.go", // the probe's own server
	}
	watched := []string{"SendNotificationToClient", "SendNotificationToAllClients", "SendNotificationToSpecificClient",
		"SendLogMessageToClient", "SendLogMessageToSpecificClient", "AddTool", "AddTools", "DeleteTools", "SetTools",
		"AddSessionTool", "AddSessionTools", "DeleteSessionTools", "AddResource", "AddResources", "AddResourceTemplate",
		"DeleteResources", "AddPrompt", "AddPrompts", "DeletePrompts", "RequestSampling", "RequestElicitation",
		"RequestRoots", "UseMiddleware", "AddTaskTool"}
	fset := gotoken.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range pkgs {
		for name, file := range pkg.Files {
			base := filepath.Base(name)
			ast.Inspect(file, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "mcpserver" {
					if !mirrored[sel.Sel.Name] {
						t.Errorf("%s: mcpserver.%s: not mirrored by the fast path (fastpath.go)", fset.Position(sel.Pos()), sel.Sel.Name)
					}
					return true
				}
				if slices.Contains(watched, sel.Sel.Name) && runtime[sel.Sel.Name] != base {
					t.Errorf("%s: %s: a notification or a tool-list change the fast path does not know of (fastpath.go)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
				return true
			})
		}
	}
}

// Concurrent calls through the fast path, legacy and modern, on one
// binding: every one answered (the race detector watches the shared state:
// the in-flight map, the session view, the binding's memory).
func TestFastPathConcurrent(t *testing.T) {
	t.Parallel()
	s := &diffSide{hh: newHTTPHarness(t, nil)}
	scriptLAP(s.hh.lap)
	s.initLegacy(t)
	r := s.post(t, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"connect_session","arguments":{"token":"`+tokA+`"}}}`, legacyHdr())
	if !bytes.Contains(r.body, []byte(`s_`)) {
		t.Fatalf("connect_session: %s", r.body)
	}
	s.handle = string(regexp.MustCompile(`s_[a-z2-7]{16}`).Find(r.body))
	n0 := s.hh.h.fast.served.Load()
	var wg sync.WaitGroup
	const workers, calls = 6, 15
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				id := fmt.Sprintf(`"w%d-%d"`, w, i)
				var r diffReply
				if w%2 == 0 {
					r = s.post(t, `{"jsonrpc":"2.0","id":`+id+`,"method":"tools/call","params":{"name":"observe","arguments":{}}}`, legacyHdr())
				} else {
					r = s.post(t, `{"jsonrpc":"2.0","id":`+id+`,"method":"tools/call","params":{"name":"observe","arguments":{"session":"{{H}}"},`+modernMeta+`}}`, modernHdr("observe"))
				}
				if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"id":`+id+`,"result":`)) || bytes.Contains(r.body, []byte(`"isError":true`)) {
					t.Errorf("%s: %d %s", id, r.status, r.body)
				}
			}
		}()
	}
	wg.Wait()
	if n := s.hh.h.fast.served.Load() - n0; n != workers*calls {
		t.Errorf("the fast path took %d of %d calls", n, workers*calls)
	}
}
