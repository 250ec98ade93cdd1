package mcp

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"slices"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// NewServer builds an MCP server with the 16 tools, the `connect` prompt and
// the workflow instructions, backed by a new Executor over cfg.Client.
func NewServer(cfg Config) (*mcpserver.MCPServer, *Executor, error) {
	return newServer(cfg)
}

// newServer is NewServer with extra mcp-go options (the HTTP endpoint's
// session hooks).
func newServer(cfg Config, extra ...mcpserver.ServerOption) (*mcpserver.MCPServer, *Executor, error) {
	e, err := NewExecutor(cfg)
	if err != nil {
		return nil, nil, err
	}
	order := map[string]int{}
	for i, d := range e.defs {
		order[d.name] = i
	}
	opts := []mcpserver.ServerOption{
		// tools/list names the tools of cfg.Tools (the core six by
		// default: every listed byte is read by the model), in workflow
		// order (connect_session first; mcp-go lists by name). All 16
		// answer when called by name, so a client or prompt written for
		// the reference's bridge (describe_app, list_actions, …) works
		// without --tools all. mcp-go runs this filter for tools/list with
		// every registered tool, and for a tools/call with the one called:
		// a single tool is a call, let through.
		mcpserver.WithToolFilter(func(_ context.Context, ts []mcpgo.Tool) []mcpgo.Tool {
			if len(ts) == 1 {
				return ts
			}
			out := make([]mcpgo.Tool, 0, len(e.listed))
			for _, t := range ts {
				if e.listed[t.Name] {
					out = append(out, t)
				}
			}
			slices.SortStableFunc(out, func(a, b mcpgo.Tool) int { return rank(order, a.Name) - rank(order, b.Name) })
			return out
		}),
		// listChanged: lapd's tool list never changes, so no
		// tools/list_changed is ever sent. Declaring it keeps a modern
		// subscriptions/listen stream open instead of answering at once,
		// which is what makes its acknowledgement arrive: mcp-go v1.2.1
		// over Streamable HTTP drops a notification sent right before a
		// handler returns (mark3labs/mcp-go#969), and the MCP conformance
		// check sep-2575-server-sends-subscription-ack failed that way.
		mcpserver.WithToolCapabilities(true),
		mcpserver.WithPromptCapabilities(false),
		mcpserver.WithInstructions(Instructions),
		mcpserver.WithTitle("lapd — drive a live web app"),
		mcpserver.WithRecovery(),
		mcpserver.WithLogger(mcpgoLogger(e.log)),
	}
	s := mcpserver.NewMCPServer(e.cfg.Name, e.cfg.Version, append(opts, extra...)...)
	e.Register(s)
	return s, e, nil
}

// StdioWorkers is how many tool calls the stdio bridge runs at once.
// mcp-go's default is 5: five long polls (wait_for_change, an approval
// wait, up to two minutes each) held every other call, observe included,
// in its queue, and the queued calls' budgets ran from when they started.
const StdioWorkers = 32

// ServeStdio serves MCP over in/out (newline-delimited JSON-RPC) until in
// reaches EOF (returns nil) or ctx is cancelled (returns nil). cfg.Mode is
// forced to ModeBridge. Nothing but protocol messages is written to out; logs
// go to cfg.Logger only. Only one ServeStdio may run per process (mcp-go's
// stdio session is a package-level singleton).
func ServeStdio(ctx context.Context, cfg Config, in io.Reader, out io.Writer) error {
	cfg.Mode = ModeBridge
	s, e, err := NewServer(cfg)
	if err != nil {
		return err
	}
	ss := mcpserver.NewStdioServer(s)
	ss.SetErrorLogger(log.New(slogWriter{e}, "", 0))
	mcpserver.WithWorkerPoolSize(StdioWorkers)(ss)
	err = ss.Listen(ctx, in, out)
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) || ctx.Err() != nil {
		return nil
	}
	return err
}

// slogWriter adapts mcp-go's *log.Logger error output to the executor's slog.Logger.
type slogWriter struct{ e *Executor }

func (w slogWriter) Write(p []byte) (int, error) {
	w.e.log.Warn("mcp stdio: " + string(p))
	return len(p), nil
}

// mcpgoLogger is the logger mcp-go gets. mcp-go logs every request and
// every tool call at Info; lapd audits tool calls through LAP already, so at
// the default level these lines were noise and a write per call. They are
// handed down to Debug (--log-level debug shows them); warnings and errors
// keep their level.
func mcpgoLogger(l *slog.Logger) *slog.Logger { return slog.New(infoAsDebug{l.Handler()}) }

type infoAsDebug struct{ slog.Handler }

func (h infoAsDebug) Enabled(ctx context.Context, l slog.Level) bool {
	if l == slog.LevelInfo {
		l = slog.LevelDebug
	}
	return h.Handler.Enabled(ctx, l)
}

func (h infoAsDebug) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo {
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h infoAsDebug) WithAttrs(as []slog.Attr) slog.Handler {
	return infoAsDebug{h.Handler.WithAttrs(as)}
}

func (h infoAsDebug) WithGroup(name string) slog.Handler {
	return infoAsDebug{h.Handler.WithGroup(name)}
}

func rank(order map[string]int, name string) int {
	if i, ok := order[name]; ok {
		return i
	}
	return len(order)
}
