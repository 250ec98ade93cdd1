package mcp

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// Regressions found by the MCP conformance suite (e2e/conformance_test.go).

// A modern request named initialize is a removed method (404), not a
// session creation: it must not be rate limited as one.
func TestHTTPModernInitializeNotRateLimited(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, func(c *HTTPConfig) { c.CreateRate = 0.001; c.CreateBurst = 1 })
	if r := hh.raw(http.MethodPost, "", initBody, nil); r.StatusCode != http.StatusOK {
		t.Fatalf("legacy initialize: %d", r.StatusCode)
	}
	modern := `{"jsonrpc":"2.0","id":5,"method":"initialize","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	r := hh.raw(http.MethodPost, "", modern, map[string]string{"MCP-Protocol-Version": mcpgo.ProtocolVersion20260728, "Mcp-Method": "initialize"})
	if r.StatusCode != http.StatusNotFound {
		t.Fatalf("modern initialize: %d, want 404 (removed method)", r.StatusCode)
	}
}

// A modern subscriptions/listen stream's first frame is the acknowledgement.
// lapd declares tools.listChanged so the stream stays open; answering at once
// raced the acknowledgement away in mcp-go v1.2.1.
func TestHTTPListenAcknowledged(t *testing.T) {
	t.Parallel()
	hh := newHTTPHarness(t, nil)
	body := `{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"notifications":{"toolsListChanged":true}}}`
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hh.srv.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", mcpgo.ProtocolVersion20260728)
		req.Header.Set("Mcp-Method", "subscriptions/listen")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		first := ""
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
				first = line
				break
			}
		}
		cancel()
		resp.Body.Close()
		if !strings.Contains(first, `"notifications/subscriptions/acknowledged"`) || !strings.Contains(first, `"toolsListChanged":true`) {
			t.Fatalf("run %d: first frame %q (status %d), want the acknowledgement", i, first, resp.StatusCode)
		}
	}
}
