package mcp

import (
	"context"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

func benchObserve(b *testing.B, call func() (*mcpgo.CallToolResult, error)) {
	b.ReportAllocs()
	for b.Loop() {
		res, err := call()
		if err != nil || res.IsError {
			b.Fatalf("%v %v", err, res)
		}
	}
}

// BenchmarkObserveInProcess: observe through mcp-go's in-process client, fake LAP.
func BenchmarkObserveInProcess(b *testing.B) {
	h := newHarness(b, nil)
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "connect_session"
	req.Params.Arguments = map[string]any{"url": base, "token": tokA}
	if _, err := h.c.CallTool(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	req.Params.Name, req.Params.Arguments = "observe", map[string]any{}
	benchObserve(b, func() (*mcpgo.CallToolResult, error) { return h.c.CallTool(context.Background(), req) })
}

// BenchmarkObserveHTTP: observe over real loopback Streamable HTTP (legacy era), fake LAP.
func BenchmarkObserveHTTP(b *testing.B) {
	hh := newHTTPHarness(b, nil)
	c := hh.client(true)
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "connect_session"
	req.Params.Arguments = map[string]any{"token": tokA}
	if _, err := c.CallTool(context.Background(), req); err != nil {
		b.Fatal(err)
	}
	req.Params.Name, req.Params.Arguments = "observe", map[string]any{}
	benchObserve(b, func() (*mcpgo.CallToolResult, error) { return c.CallTool(context.Background(), req) })
}
