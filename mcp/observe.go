package mcp

import (
	"context"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"github.com/lapd-dev/lapd/audit"
)

// Observer is told about every tool call, for metrics. ToolCall runs on the
// call's goroutine after the result is built and must not block.
type Observer interface {
	// ToolCall: era is "legacy" or "modern" (the MCP protocol era of the
	// request; stdio reports its own), isError whether the result is an
	// isError result.
	ToolCall(tool, era string, d time.Duration, isError bool)
}

// observedCall runs one tool call under a request id (the context's, e.g. from the
// /agent/mcp request's X-Request-Id, else a new one): every LAP call it
// makes, the audit entries and the rpc frames they cause carry it.
func (e *Executor) observedCall(ctx context.Context, d toolDef, req mcpgo.CallToolRequest) *mcpgo.CallToolResult {
	if audit.RequestID(ctx) == "" {
		ctx = audit.WithRequestID(ctx, audit.NewRequestID())
	}
	obs := e.cfg.Observer
	if obs == nil {
		return e.handle(ctx, d, req)
	}
	start := time.Now()
	res := e.handle(ctx, d, req)
	era := "legacy"
	if mcpserver.IsModernRequest(ctx) {
		era = "modern"
	}
	obs.ToolCall(d.name, era, time.Since(start), res != nil && res.IsError)
	return res
}

// Tools returns the names of the tools the executor serves, in catalogue
// order (a metrics label set).
func (e *Executor) Tools() []string {
	out := make([]string, len(e.defs))
	for i, d := range e.defs {
		out[i] = d.name
	}
	return out
}
