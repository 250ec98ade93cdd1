package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestMCPHTTPBlackBox drives the real `lapd serve` /agent/mcp with raw HTTP,
// as an outside tester does, for what the black-box review of 2026-11-26
// found (docs/PROTOCOL.md "MCP endpoint"): each answer is one a client can
// act on.
func TestMCPHTTPBlackBox(t *testing.T) {
	const app = "http://app.example"
	s := startServer(t, "", "--origins", app)
	url := s.URL + "/agent/mcp"
	do := func(method, sid, body string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bb","version":"1"}}}`

	if r, b := do("PUT", "", initBody, nil); r.StatusCode != 405 || r.Header.Get("Allow") == "" || !strings.Contains(b, "method-not-allowed") {
		t.Fatalf("PUT: %d %q %s", r.StatusCode, r.Header.Get("Allow"), b)
	}
	if r, b := do("POST", "", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, nil); r.StatusCode != 400 || !strings.Contains(b, `"code":-32600`) || !strings.Contains(b, "send initialize first") {
		t.Fatalf("tools/list without a session: %d %s", r.StatusCode, b)
	}
	if r, _ := do("OPTIONS", "", "", map[string]string{"Origin": app, "Access-Control-Request-Method": "POST"}); r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != app {
		t.Fatalf("preflight from --origins: %d %v", r.StatusCode, r.Header)
	}
	r, _ := do("POST", "", initBody, map[string]string{"Origin": app})
	sid := r.Header.Get("Mcp-Session-Id")
	if r.StatusCode != 200 || sid == "" || !strings.Contains(r.Header.Get("Access-Control-Expose-Headers"), "Mcp-Session-Id") {
		t.Fatalf("cross-origin initialize: %d %v", r.StatusCode, r.Header)
	}
	if r, b := do("POST", sid, `[{"jsonrpc":"2.0","id":3,"method":"ping"}]`, nil); r.StatusCode != 400 || !strings.Contains(b, `"code":-32600`) || !strings.Contains(b, "batches are not supported") {
		t.Fatalf("batch: %d %s", r.StatusCode, b)
	}

	// The session's GET stream ends when the session is deleted.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	stream, err := http.DefaultClient.Do(req)
	if err != nil || stream.StatusCode != 200 {
		t.Fatalf("GET stream: %v %v", err, stream)
	}
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stream.Body); close(ended) }()
	if r, _ := do("DELETE", sid, "", nil); r.StatusCode != 200 {
		t.Fatalf("DELETE: %d", r.StatusCode)
	}
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("the GET stream of a deleted session is still open")
	}
	stream.Body.Close()
}
