package lap

import (
	"context"
	"encoding/json"
	"time"
)

// Client calls LAP routes. The mcp package reaches lapd only through it. Two
// implementations: HTTPClient (a remote lapd over HTTP; used by `lapd mcp`)
// and InProcessClient (the Server's own handler, no network; used by
// /agent/mcp inside `lapd serve`).
type Client interface {
	// Call POSTs body (nil = no body) to route (for example "/observe") of the
	// LAP base URL base (ignored by the in-process client) with the bearer
	// token. A LAP error (any non-2xx) is returned as a *Error with the wire
	// code; a transport failure as a *Error with Code "network". On success
	// the raw JSON response body is returned.
	Call(ctx context.Context, base, token, route string, body any) (json.RawMessage, error)
}

// Error is a LAP error envelope plus what the HTTP response said about retrying.
type Error struct {
	Status     int           // HTTP status; 0 for a network failure
	Code       string        // wire code: auth-failed, revoked, paused, rate-limited, invalid, schema-error, timeout, internal, ... or "network"
	Detail     string        // optional
	RetryAfter time.Duration // from Retry-After or retryAfterMs; 0 if absent
	Reconnect  string        // X-LLui-Reconnect / error.reconnect on 503 paused: pending|expired|revoked|unknown
}

func (e *Error) Error() string {
	s := "lap: status " + itoa(e.Status) + " code=" + e.Code
	if e.Detail != "" {
		s += " — " + e.Detail
	}
	return s
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
