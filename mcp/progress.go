package mcp

import (
	"context"
	"sync"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// progress sends notifications/progress for one tool call while it waits:
// once when a phase starts (Set) and then every interval until Stop. It is a
// no-op when the request carried no progress token. Correctness never depends
// on these notifications (mcp-go over Streamable HTTP may drop one sent right
// before the result).
type progress struct {
	ctx   context.Context
	srv   *mcpserver.MCPServer
	token mcpgo.ProgressToken

	onSend func() // before each send, if set

	sendMu sync.Mutex // serialises sends so progress values rise monotonically
	mu     sync.Mutex // guards msg
	n      int        // guarded by sendMu
	msg    string
	stop   chan struct{}
	done   chan struct{}
}

// startProgress returns nil (all methods are nil-safe) when there is no token.
// onSend, if set, runs before each notification.
func startProgress(ctx context.Context, req mcpgo.CallToolRequest, interval time.Duration, onSend func()) *progress {
	if req.Params.Meta == nil || req.Params.Meta.ProgressToken == nil {
		return nil
	}
	srv := mcpserver.ServerFromContext(ctx)
	if srv == nil {
		return nil
	}
	p := &progress{ctx: ctx, srv: srv, token: req.Params.Meta.ProgressToken, onSend: onSend, stop: make(chan struct{}), done: make(chan struct{})}
	go p.loop(interval)
	return p
}

func (p *progress) loop(interval time.Duration) {
	defer close(p.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.ctx.Done():
			return
		case <-t.C:
			p.mu.Lock()
			msg := p.msg
			p.mu.Unlock()
			if msg != "" {
				p.send(msg)
			}
		}
	}
}

// Set starts a phase: it records msg for the ticker and sends it now.
func (p *progress) Set(msg string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.msg = msg
	p.mu.Unlock()
	p.send(msg)
}

func (p *progress) send(msg string) {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	p.n++
	n := p.n
	if p.onSend != nil {
		p.onSend()
	}
	_ = p.srv.SendNotificationToClient(p.ctx, "notifications/progress", map[string]any{
		"progressToken": p.token,
		"progress":      n,
		"message":       msg,
	})
}

// Stop ends the ticker and waits for it.
func (p *progress) Stop() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
}
