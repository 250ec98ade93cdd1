package lap

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/lapd-dev/lapd/audit"
)

// HeaderRequestID carries a call's request id: a caller may send one (kept
// when audit.ValidRequestID accepts it, else replaced), and every meta and
// LAP response names the id lapd used. The HTTP client sends the id of its
// context, so a stdio bridge's MCP call and the LAP call it makes share one.
const HeaderRequestID = "X-Request-Id"

// Observer is told about every meta and LAP call and every RPC a LAP call
// makes to a tab, for metrics. Its methods run on the request's goroutine
// (Call after the response is written) and must neither block nor keep
// their arguments' memory beyond the call.
type Observer interface {
	// Call: api is "lap" or "meta"; route is the path under the LAP base
	// path or under Prefix ("/observe", "/mint"); status the HTTP status
	// written; rid the call's request id.
	Call(api, route string, status int, d time.Duration, rid string)
	// RPC: tool is the tab tool ("observe", "send_message", …); err is
	// what pairing.Registry.Call returned.
	RPC(tool string, d time.Duration, err error)
}

// requestID returns r's request id (the context's, else a valid
// X-Request-Id header, else a new one) and a context carrying it.
func requestID(r *http.Request) (context.Context, string) {
	ctx := r.Context()
	if rid := audit.RequestID(ctx); rid != "" {
		return ctx, rid // in-process: the MCP call's id
	}
	rid := r.Header.Get(HeaderRequestID)
	if !audit.ValidRequestID(rid) {
		rid = audit.NewRequestID()
	}
	return audit.WithRequestID(ctx, rid), rid
}

// logCall writes the debug line that joins a call's logs with its audit
// entries and metrics.
func (s *Server) logCall(ctx context.Context, api, route string, status int, start time.Time, rid string) {
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	ms := float64(time.Since(start).Microseconds()) / 1000
	s.log.LogAttrs(ctx, slog.LevelDebug, api+" call", slog.String("rid", rid), slog.String("route", route),
		slog.Int("status", status), slog.Float64("ms", ms))
}

// statusWriter remembers the status a meta handler wrote (meta routes
// have many exits; LAP's serveLAP knows its status itself). Pooled.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

var statusWriters = sync.Pool{New: func() any { return new(statusWriter) }}
