package audit

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"strconv"
	"sync/atomic"
)

// Request ids join what one LAP or MCP call left behind: its log lines, its
// audit entries (detail.rid), the rpc frame it sent to the tab (rid) and a
// latency exemplar on /metrics. The call's entry point puts one in the
// context (WithRequestID); Log.Record reads it from there, so nobody passes
// it by hand.

type ridKey struct{}

// WithRequestID returns ctx carrying request id rid.
func WithRequestID(ctx context.Context, rid string) context.Context {
	return context.WithValue(ctx, ridKey{}, rid)
}

// RequestID returns the request id ctx carries, or "".
func RequestID(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	rid, _ := ctx.Value(ridKey{}).(string)
	return rid
}

// MaxRequestID is the longest request id accepted from a caller (the
// X-Request-Id header).
const MaxRequestID = 64

// ValidRequestID reports whether a caller-supplied request id may be used as
// is: 1 to MaxRequestID characters of A-Z a-z 0-9 . : - (no '_', so an
// agent token can never pass for one, and nothing a log line or a JSON
// string would need to escape).
func ValidRequestID(s string) bool {
	if s == "" || len(s) > MaxRequestID {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// ridPrefix is random per process, so ids stay unique across restarts;
// ridSeq makes them unique within it without a random read per call.
var (
	ridPrefix = func() string {
		var b [5]byte
		_, _ = rand.Read(b[:])
		return base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:])
	}()
	ridSeq atomic.Uint64
)

// NewRequestID returns a new request id: the process's random 8-character
// prefix, a dash and a sequence number in base 36 ("0K6Q2D9M-1f").
func NewRequestID() string {
	var buf [8 + 1 + 13]byte
	b := append(buf[:0], ridPrefix...)
	b = append(b, '-')
	b = strconv.AppendUint(b, ridSeq.Add(1), 36)
	return string(b)
}
