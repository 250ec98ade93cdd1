// Package pairing is the tab side of lapd: the /agent/ws WebSocket endpoint,
// the registry of paired tabs keyed by tid, and RPC correlation over it.
//
// The token is verified before the upgrade (401/403 with the JSON error
// envelope, never 101-then-close). Each tab has one reader goroutine and a
// bounded send queue; a stuck tab is closed, never allowed to block others.
// Every Call is answered exactly once: the tab's reply, its rpc-error, a
// timeout, or ErrPaused when the tab goes away (a newer socket for the same tid
// supersedes the old one and inherits its in-flight calls).
package pairing

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/tokens"
)

// Protocol versions.
const (
	LapVersion       = 2
	MinClientVersion = 2
)

// Errors from Call, Push and Watch.
var (
	ErrPaused  = errors.New("pairing: tab not connected") // → 503 paused
	ErrTimeout = errors.New("pairing: rpc timed out")     // → 504 timeout
	ErrClosed  = errors.New("pairing: registry closed")   // shutting down
)

// RPCError is a tab's rpc-error reply.
type RPCError struct {
	Code   string `json:"code"`
	Detail string `json:"detail,omitempty"`
}

func (e *RPCError) Error() string { return "pairing: tab error " + e.Code + ": " + e.Detail }

// Hello is the cached hello frame of a tab (reference fields plus lapd's
// additive Policy and Visible).
type Hello struct {
	AppName           string          `json:"appName"`
	AppVersion        string          `json:"appVersion"`
	MsgSchema         json.RawMessage `json:"msgSchema,omitempty"`
	StateSchema       json.RawMessage `json:"stateSchema,omitempty"`
	AffordancesSample json.RawMessage `json:"affordancesSample,omitempty"`
	Docs              json.RawMessage `json:"docs,omitempty"`
	SchemaHash        string          `json:"schemaHash"`
	LapVersion        int             `json:"lapVersion,omitempty"`
	Policy            json.RawMessage `json:"policy,omitempty"` // lapd: per-variant JSON Schema + annotations (see schema package)
}

// ConfirmResolved is a tab's confirm-resolved frame.
type ConfirmResolved struct {
	ConfirmID  string          `json:"confirmId"`
	Outcome    string          `json:"outcome"` // confirmed | user-cancelled
	StateAfter json.RawMessage `json:"stateAfter,omitempty"`
}

// Health is what lapd knows about a tab's connection (for observe).
type Health struct {
	Connected     bool  `json:"connected"`
	Visible       *bool `json:"visible,omitempty"`         // nil = the tab never said
	LastHeartbeat int64 `json:"lastHeartbeatAt,omitempty"` // ms
	ConnectedAt   int64 `json:"connectedAt,omitempty"`
	Reconnects    int   `json:"reconnects"`
}

// Hooks let the composition root react to tab events. Each may be nil. They
// are called from the tab's reader goroutine and must not block for long.
type Hooks struct {
	OnPaired          func(tid string, repair bool) // after the socket is registered and hello-ack sent
	OnClosed          func(tid string)              // the tab's socket is gone (not when superseded)
	OnConfirmResolved func(tid string, r ConfirmResolved)
	OnLogAppend       func(tid string, entry json.RawMessage) // after it is put in the ring
}

// Config configures a Registry. Zero values mean the documented defaults.
type Config struct {
	Tokens         *tokens.Manager // required
	Audit          *audit.Log      // nil = no audit
	Logger         *slog.Logger    // nil = discard
	AllowedOrigins []string        // exact Origin values allowed besides same-origin
	PingInterval   time.Duration   // default 15s; a tab that misses two pongs is closed
	RPCTimeout     time.Duration   // default 15s (Call with timeout 0)
	SendQueue      int             // frames queued per tab; default 256; full → tab closed
	WriteTimeout   time.Duration   // default 10s
	MaxFrame       int64           // default 4 MiB
	Retention      time.Duration   // buffers kept after close; default 60s
	MaxClosed      int             // closed tabs whose buffers are kept; default 128
	LogRing        int             // recent-log entries per tid; default 100
	Hooks          Hooks
}

// Registry holds the paired tabs. Safe for concurrent use.
type Registry struct {
	cfg Config
}

// New returns a Registry.
func New(cfg Config) (*Registry, error) { panic("pairing: New not implemented") }

// SetHooks installs the hooks (the lap server does this in lap.New). Call it
// before serving.
func (r *Registry) SetHooks(h Hooks) { panic("not implemented") }

// ServeHTTP is the /agent/ws endpoint.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) { panic("not implemented") }

// Call sends {t:'rpc', id, tool, args} to tid's tab and waits for the answer.
// timeout 0 = Config.RPCTimeout. Errors: ErrPaused, ErrTimeout, *RPCError,
// ctx.Err().
func (r *Registry) Call(ctx context.Context, tid, tool string, args any, timeout time.Duration) (json.RawMessage, error) {
	panic("not implemented")
}

// Push queues a server→tab frame (any JSON-marshalable value with a "t"
// field). ErrPaused if tid has no socket.
func (r *Registry) Push(tid string, frame any) error { panic("not implemented") }

// IsPaired reports whether tid has a live socket.
func (r *Registry) IsPaired(tid string) bool { panic("not implemented") }

// Hello returns tid's cached hello.
func (r *Registry) Hello(tid string) (Hello, bool) { panic("not implemented") }

// Health reports tid's connection health.
func (r *Registry) Health(tid string) Health { panic("not implemented") }

// Watch pushes watch{id,path}, waits for the matching state-update and pushes
// unwatch{id}. It returns the update's stateAfter; ErrTimeout when ctx's
// deadline passes first; ErrPaused if the socket goes away.
func (r *Registry) Watch(ctx context.Context, tid, path string) (json.RawMessage, error) {
	panic("not implemented")
}

// RecentLog returns up to n of tid's log-append entries, newest first,
// optionally only those of kind.
func (r *Registry) RecentLog(tid string, n int, kind string) []json.RawMessage {
	panic("not implemented")
}

// Unregister pushes {t:'revoked'}, closes tid's socket, fails its calls and
// drops its buffers (revoke, version skew).
func (r *Registry) Unregister(tid string) { panic("not implemented") }

// Shutdown closes every socket with close code 1012 (service restart; the
// client reconnects), fails in-flight calls, and waits for the goroutines it
// started, or for ctx.
func (r *Registry) Shutdown(ctx context.Context) error { panic("not implemented") }
