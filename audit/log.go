package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/lapd-dev/lapd/internal/redact"
)

// Config configures a Log.
type Config struct {
	Sinks  []Sink           // every entry goes to each; none = entries are only counted
	Logger *slog.Logger     // where sink failures are reported; nil = discard
	Clock  func() time.Time // stamps entries with At == 0; default time.Now
}

// Limits applied by Record to every entry's Detail before any sink sees it.
const (
	// MaxDetailString is the longest string value kept in a Detail, in bytes;
	// longer values are cut (at a rune boundary) and end in "…".
	MaxDetailString = 1024
	// MaxDetailDepth bounds how deep nested maps and slices are copied;
	// deeper values are replaced by "…".
	MaxDetailDepth = 8
	// redacted replaces an agent token or tab secret anywhere in a detail string.
	redacted = redact.Redacted
)

// Log fans entries out to its sinks. Safe for concurrent use; a nil *Log
// discards everything (handy in tests of other packages).
type Log struct {
	cfg       Config
	recorded  atomic.Int64
	failures  atomic.Int64
	closeOnce sync.Once
	closeErr  error
}

// New returns a Log.
func New(cfg Config) *Log {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	cfg.Sinks = append([]Sink(nil), cfg.Sinks...)
	return &Log{cfg: cfg}
}

// Record writes e to every sink, stamping At when zero. A sink error is logged
// and counted (Failures), never returned: auditing must not fail a request.
//
// Before any sink sees it, Detail is copied with every agent token or tab
// secret in a string, wherever it stands, replaced by "agt_…redacted" (tokens
// must never reach audit, even by mistake) and long strings cut to
// MaxDetailString bytes.
func (l *Log) Record(ctx context.Context, e Entry) {
	if l == nil {
		return
	}
	l.recorded.Add(1)
	if e.At == 0 {
		e.At = l.cfg.Clock().UnixMilli()
	}
	if e.RequestID == "" {
		e.RequestID = RequestID(ctx)
	}
	e.Detail = sanitizeMap(e.Detail, 0)
	if e.RequestID != "" && ValidRequestID(e.RequestID) {
		if e.Detail == nil {
			e.Detail = map[string]any{}
		}
		e.Detail["rid"] = e.RequestID
	}
	for _, s := range l.cfg.Sinks {
		if err := s.Write(ctx, e); err != nil {
			l.failures.Add(1)
			l.cfg.Logger.Warn("audit: sink write failed; entry not stored there",
				"sink", fmt.Sprintf("%T", s), "event", e.Event, "tid", e.TID, "err", err)
		}
	}
}

// Recorded reports how many entries Record has been given since New.
func (l *Log) Recorded() int64 {
	if l == nil {
		return 0
	}
	return l.recorded.Load()
}

// Failures reports how many sink writes have failed since New.
func (l *Log) Failures() int64 {
	if l == nil {
		return 0
	}
	return l.failures.Load()
}

// Close closes every sink once; later calls return the first result.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.closeOnce.Do(func() {
		var errs []error
		for _, s := range l.cfg.Sinks {
			if err := s.Close(); err != nil {
				errs = append(errs, fmt.Errorf("audit: close %T: %w", s, err))
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// sanitizeMap returns a copy of m with sanitizeValue applied to each value;
// nil stays nil.
func sanitizeMap(m map[string]any, depth int) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = sanitizeValue(v, depth+1)
	}
	return out
}

func sanitizeValue(v any, depth int) any {
	if depth > MaxDetailDepth {
		return "…"
	}
	switch v := v.(type) {
	case string:
		return sanitizeString(v)
	case map[string]any:
		return sanitizeMap(v, depth)
	case map[string]string:
		out := make(map[string]any, len(v))
		for k, s := range v {
			out[k] = sanitizeString(s)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = sanitizeValue(x, depth+1)
		}
		return out
	case []string:
		out := make([]any, len(v))
		for i, s := range v {
			out[i] = sanitizeString(s)
		}
		return out
	case error:
		return sanitizeString(v.Error())
	case fmt.Stringer:
		return sanitizeString(v.String())
	}
	return v
}

func sanitizeString(s string) string {
	s = redact.String(s) // before cutting: a cut token would be harder to spot
	if len(s) <= MaxDetailString {
		return s
	}
	cut := MaxDetailString
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Filter selects entries for Query. Zero fields match everything.
type Filter struct {
	TID    string
	Event  string
	Events []string // when not empty, only entries whose event is one of these (and Event, if set)
	Since  int64    // ms, inclusive
	Until  int64    // ms, exclusive; 0 = no bound
	Limit  int      // 0 = no limit; the newest Limit entries, oldest first
	Offset int      // with Limit: skip the newest Offset matching entries first (paging back)
}

// match reports whether e passes f's field filters (not Limit).
func (f Filter) match(e Entry) bool {
	return (f.TID == "" || e.TID == f.TID) &&
		(f.Event == "" || e.Event == f.Event) &&
		(len(f.Events) == 0 || slices.Contains(f.Events, e.Event)) &&
		e.At >= f.Since &&
		(f.Until == 0 || e.At < f.Until)
}

// Querier is implemented by sinks that can read entries back (SQLite, JSONL file).
type Querier interface {
	Query(ctx context.Context, f Filter) ([]Entry, error)
}

// FormatText renders e on one line for humans (the `lapd audit` command):
//
//	2026-11-23T10:00:00.123Z  mint  tid=…  uid=…  {"origin":"…"}
//
// A missing tid or uid reads "-".
func FormatText(e Entry) string {
	tid, uid := e.TID, e.UID
	if tid == "" {
		tid = "-"
	}
	if uid == "" {
		uid = "-"
	}
	detail := "{}"
	if len(e.Detail) > 0 {
		if b, err := marshalDetail(e.Detail); err == nil {
			detail = string(b)
		}
	}
	at := time.UnixMilli(e.At).UTC().Format("2006-01-02T15:04:05.000Z07:00")
	return at + "  " + e.Event + "  tid=" + tid + "  uid=" + uid + "  " + detail
}
