package audit

import (
	"context"
	"log/slog"
	"time"
)

// Config configures a Log.
type Config struct {
	Sinks  []Sink           // every entry goes to each; none = entries are only counted
	Logger *slog.Logger     // where sink failures are reported; nil = discard
	Clock  func() time.Time // stamps entries with At == 0; default time.Now
}

// Log fans entries out to its sinks. Safe for concurrent use; a nil *Log
// discards everything (handy in tests of other packages).
type Log struct {
	cfg Config
}

// New returns a Log.
func New(cfg Config) *Log { panic("audit: New not implemented") }

// Record writes e to every sink, stamping At when zero. A sink error is logged
// and counted (Failures), never returned: auditing must not fail a request.
func (l *Log) Record(ctx context.Context, e Entry) { panic("not implemented") }

// Failures reports how many sink writes have failed since New.
func (l *Log) Failures() int64 { panic("not implemented") }

// Close closes every sink.
func (l *Log) Close() error { panic("not implemented") }

// Filter selects entries for Query. Zero fields match everything.
type Filter struct {
	TID   string
	Event string
	Since int64 // ms, inclusive
	Until int64 // ms, exclusive; 0 = no bound
	Limit int   // 0 = no limit; the newest Limit entries, oldest first
}

// Querier is implemented by sinks that can read entries back (SQLite, JSONL file).
type Querier interface {
	Query(ctx context.Context, f Filter) ([]Entry, error)
}
