package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

// mcpAgent is one MCP client (mcp-go over Streamable HTTP at /agent/mcp)
// connected to one session with connect_session, as Claude would be.
type mcpAgent struct {
	c      *client.Client
	handle string
}

func dialMCP(ctx context.Context, base string, m mintResp, agents int) (*mcpAgent, error) {
	tr, err := transport.NewStreamableHTTP(base+"/agent/mcp",
		transport.WithHTTPBasicClient(httpClient(agents)), transport.WithHTTPTimeout(30*time.Second))
	if err != nil {
		return nil, err
	}
	c := client.NewClient(tr)
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "lapbench", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		c.Close()
		return nil, fmt.Errorf("mcp initialize: %w", err)
	}
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "connect_session"
	req.Params.Arguments = map[string]any{"line": "Connect to my app with lapd: connect_session url=" + m.LapURL + " token=" + m.Token}
	res, err := c.CallTool(ctx, req)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("connect_session: %w", err)
	}
	sc, _ := res.StructuredContent.(map[string]any)
	h, _ := sc["session"].(string)
	if res.IsError || !strings.HasPrefix(h, "s_") {
		c.Close()
		return nil, fmt.Errorf("connect_session: %v", res.Content)
	}
	return &mcpAgent{c: c, handle: h}, nil
}

// observeOp calls the observe tool.
func (a *mcpAgent) observeOp() op {
	req := mcpgo.CallToolRequest{}
	req.Params.Name = "observe"
	req.Params.Arguments = map[string]any{"session": a.handle}
	return func(ctx context.Context, _ *bytes.Buffer) error {
		res, err := a.c.CallTool(ctx, req)
		if err != nil {
			return err
		}
		if res.IsError {
			return errors.New("observe: tool error")
		}
		return nil
	}
}

// rawObserveOp calls the observe tool as one plain 2026-07-28 JSON-RPC POST
// (the headers and _meta the protocol requires) and, like the LAP ops,
// reads the response without decoding it: it checks the status, the
// Content-Type and that the result is not an error. It measures the
// server's MCP path without mcp-go's client, which decodes a result several
// times over (docs/PERFORMANCE.md).
func (a *mcpAgent) rawObserveOp(hc *http.Client, url string) op {
	var n atomic.Int64
	return func(ctx context.Context, buf *bytes.Buffer) error {
		id := n.Add(1)
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"observe","arguments":{"session":%q},"_meta":{"io.modelcontextprotocol/protocolVersion":%q,"io.modelcontextprotocol/clientCapabilities":{}}}}`,
			id, a.handle, mcpgo.ProtocolVersion20260728)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set(mcpgo.HeaderProtocolVersion, mcpgo.ProtocolVersion20260728)
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "observe")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		buf.Reset()
		_, err = buf.ReadFrom(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		b := buf.Bytes()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" ||
			!bytes.HasPrefix(b, []byte(`{"jsonrpc":"2.0","id":`+strconv.FormatInt(id, 10)+`,"result":`)) || bytes.Contains(b, []byte(`"isError":true`)) {
			return fmt.Errorf("observe: %w %d %s: %.200s", errStatus, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		return nil
	}
}
