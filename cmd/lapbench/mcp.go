package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
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
