package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseConnectLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, line, base, token string
		err                     bool
	}{
		{"reference snippet", `Call the LLui MCP server's connect_session with url="http://localhost:5173/agent/lap/v1" and token="` + tokA + `". Use narrate.`, "http://localhost:5173/agent/lap/v1", tokA, false},
		{"slash command", "/llui-connect https://app.example/agent/lap/v1 " + tokA, "https://app.example/agent/lap/v1", tokA, false},
		{"origin only gets the default path", "connect to http://127.0.0.1:8080 with " + tokA, "http://127.0.0.1:8080/agent/lap/v1", tokA, false},
		{"trailing punctuation and slash", "see https://x.test/agent/lap/v1/. token " + tokA + ".", "https://x.test/agent/lap/v1", tokA, false},
		{"json", `{"url":"http://h:1/agent/lap/v1","token":"` + tokA + `"}`, "http://h:1/agent/lap/v1", tokA, false},
		{"token only", "my token is " + tokA, "", tokA, false},
		{"no token", "http://h/agent/lap/v1", "http://h/agent/lap/v1", "", true},
		{"too short token", "agt_abc", "", "", true},
		{"too long", strings.Repeat("x", MaxConnectLine+1), "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, tok, err := ParseConnectLine(tc.line)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v", err)
			}
			if err == nil && (b != tc.base || tok != tc.token) {
				t.Fatalf("got %q %q", b, tok)
			}
		})
	}
}

func FuzzParseConnectLine(f *testing.F) {
	f.Add(`url="http://localhost/agent/lap/v1" token="` + tokA + `"`)
	f.Fuzz(func(t *testing.T, line string) {
		b, tok, err := ParseConnectLine(line)
		if err == nil && !strings.HasPrefix(tok, "agt_") {
			t.Fatalf("token %q", tok)
		}
		if b != "" && !strings.HasPrefix(b, "http") {
			t.Fatalf("base %q", b)
		}
	})
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestBindingsBounds(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Unix(1000, 0)}
	b := NewBindings(BindingsConfig{MaxBindings: 3, MaxBindingsPerScope: 2, MaxBindingsPerToken: 1, IdleTTL: time.Minute, Now: clk.Now})

	// Per token: a second scope with the same token evicts the first binding.
	x := mustBind(t, b, "s1", base, tokA)
	clk.add(time.Second)
	y := mustBind(t, b, "s2", base, tokA)
	if _, _, err := b.Resolve("", x.Handle); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("per-token eviction: %v", err)
	}
	// Per scope: the LRU of the scope goes.
	clk.add(time.Second)
	t1 := mustBind(t, b, "s3", base, "agt_1111111111111111111")
	clk.add(time.Second)
	t2 := mustBind(t, b, "s3", base, "agt_2222222222222222222")
	clk.add(time.Second)
	if _, _, err := b.Resolve("", t1.Handle); err != nil { // touch t1
		t.Fatal(err)
	}
	clk.add(time.Second)
	mustBind(t, b, "s3", base, "agt_3333333333333333333")
	if _, _, err := b.Resolve("", t2.Handle); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("scope LRU eviction kept t2: %v", err)
	}
	if b.Len() != 3 {
		t.Fatalf("len %d", b.Len())
	}
	// Whole table: y is the LRU overall.
	clk.add(time.Second)
	mustBind(t, b, "s4", base, "agt_4444444444444444444")
	if _, _, err := b.Resolve("", y.Handle); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("table LRU eviction kept y: %v", err)
	}
	// Idle TTL.
	clk.add(2 * time.Minute)
	if b.Len() != 0 {
		t.Fatalf("idle bindings survived: %d", b.Len())
	}
	// Scope "" never defaults.
	z := mustBind(t, b, "", base, tokB)
	if _, _, err := b.Resolve("", ""); !errors.Is(err, ErrSessionRequired) {
		t.Fatalf("modern default: %v", err)
	}
	if got, _, err := b.Resolve("other", z.Handle); err != nil || got.Token != tokB {
		t.Fatalf("handle as capability: %v", err)
	}
}

// Modern HTTP clients all have scope "" (no MCP session): capped as one
// caller scope, 16 anonymous tokens' bindings evicted every other modern
// client's (reproduced on lapd serve: 16 mints, 16 connect_session calls,
// and the honest client's handle was "unknown or expired").
func TestBindingsModernClientsAreNotOneScope(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Unix(1000, 0)}
	b := NewBindings(BindingsConfig{MaxBindings: 8, MaxBindingsPerScope: 2, MaxBindingsPerToken: 2, IdleTTL: time.Minute, Now: clk.Now})
	honest := mustBind(t, b, "", base, tokA)
	for i := range 4 {
		clk.add(time.Second)
		mustBind(t, b, "", base, fmt.Sprintf("agt_attacker%020d", i))
	}
	if _, _, err := b.Resolve("", honest.Handle); err != nil {
		t.Fatalf("another modern client's bindings evicted the honest one (per-scope cap on scope \"\"): %v", err)
	}
}

// A full table gives up a binding of the token holding the most, not the
// least recently used overall: one token's many bindings (one per legacy MCP
// session) cannot push out a token that holds one.
func TestBindingsFullTableEvictsTheBiggestToken(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Unix(1000, 0)}
	b := NewBindings(BindingsConfig{MaxBindings: 4, MaxBindingsPerScope: 4, MaxBindingsPerToken: 3, IdleTTL: time.Minute, Now: clk.Now})
	honest := mustBind(t, b, "h", base, tokA)
	var first Binding
	for i := range 3 {
		clk.add(time.Second)
		x := mustBind(t, b, fmt.Sprintf("s%d", i), base, tokB)
		if i == 0 {
			first = x
		}
	}
	clk.add(time.Second)
	mustBind(t, b, "s9", base, "agt_3333333333333333333")
	if _, _, err := b.Resolve("", honest.Handle); err != nil {
		t.Fatalf("the full table evicted the honest token's only binding (LRU overall): %v", err)
	}
	if _, _, err := b.Resolve("", first.Handle); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("the biggest token's least recently used binding survived: %v", err)
	}
	if b.Len() != 4 {
		t.Fatalf("len %d", b.Len())
	}
}

// TestServeStdio runs the real stdio server over pipes with newline-delimited JSON-RPC.
func TestServeStdio(t *testing.T) {
	// Not parallel: mcp-go's stdio session is process-global.
	f := newFakeLAP()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeStdio(context.Background(), Config{Client: f}, inR, outW) }()
	dec := json.NewDecoder(outR)
	send := func(s string) {
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	read := func() map[string]any {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	init := read()
	if r, _ := init["result"].(map[string]any); r == nil || !strings.Contains(r["instructions"].(string), "connect_session") {
		t.Fatalf("initialize: %v", init)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"connect_session","arguments":{"line":"` + base + ` ` + tokA + `"}}}`)
	res := read()
	raw, _ := json.Marshal(res["result"])
	if !bytes.Contains(raw, []byte(`"status":"connected"`)) || bytes.Contains(raw, []byte(`"isError":true`)) {
		t.Fatalf("connect over stdio: %s", raw)
	}
	inW.Close() // EOF → clean exit
	if err := <-done; err != nil {
		t.Fatalf("ServeStdio: %v", err)
	}
	outR.Close()
}

func TestServeStdioCancel(t *testing.T) {
	// Not parallel: mcp-go's stdio session is process-global.
	inR, inW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeStdio(ctx, Config{Client: newFakeLAP()}, inR, io.Discard) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeStdio after cancel: %v", err)
	}
	inW.Close() // releases mcp-go's pending stdin read
}

func mustBind(t *testing.T, tbl *Bindings, scope, base, token string) Binding {
	t.Helper()
	b, err := tbl.Bind(scope, base, token)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Long calls over stdio must not hold up the others: mcp-go's default pool
// of 5 workers queued a sixth call (observe included) behind five long
// polls, found by driving `lapd mcp` with six wait_for_change calls.
func TestServeStdioLongCallsDoNotBlockOthers(t *testing.T) {
	// Not parallel: mcp-go's stdio session is process-global.
	const long = 8
	bl := &waitBlockingLAP{fakeLAP: newFakeLAP(), entered: make(chan struct{}, long)}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeStdio(ctx, Config{Client: bl}, inR, outW) }()
	answers := make(chan map[string]any, 16)
	go func() {
		dec := json.NewDecoder(outR)
		for {
			var m map[string]any
			if dec.Decode(&m) != nil {
				close(answers)
				return
			}
			answers <- m
		}
	}()
	send := func(s string) {
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	guard, stop := context.WithTimeout(context.Background(), 20*time.Second)
	defer stop()
	await := func(id float64) map[string]any {
		for {
			select {
			case m := <-answers:
				if m["id"] == id {
					return m
				}
			case <-guard.Done():
				t.Fatalf("no answer to request %v while %d long calls run", id, long)
			}
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	await(1)
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"connect_session","arguments":{"line":"` + base + ` ` + tokA + `"}}}`)
	await(2)
	for i := range long {
		send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"wait_for_change","arguments":{"timeoutMs":120000}}}`, 100+i))
	}
	for i := range long {
		select {
		case <-bl.entered:
		case <-guard.Done():
			t.Fatalf("only %d of %d wait_for_change calls started", i, long)
		}
	}
	send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"observe","arguments":{}}}`)
	if m := await(3); m["result"] == nil {
		t.Fatalf("observe: %v", m)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeStdio: %v", err)
	}
	inW.Close()
	outW.Close()
	for range answers {
	}
}
