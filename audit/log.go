package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/lapd-dev/lapd/internal/redact"
)

// Config configures a Log. Zero values mean the documented defaults.
type Config struct {
	Sinks  []Sink           // every entry goes to each; none = entries are only counted
	Logger *slog.Logger     // where sink failures and overflows are reported; nil = discard
	Clock  func() time.Time // stamps entries with At == 0; default time.Now

	// QueueSize bounds the entries waiting for the writer; default 16,384.
	QueueSize int
	// FullWait is how long Record waits for room when the queue is full
	// (backpressure on the caller); default 2s. After that the entry is
	// counted as dropped (Dropped), the drop is logged, and an
	// audit-overflow entry says how many entries of which events were lost.
	// While the queue stays over half full after a drop, Record does not
	// wait again (a dead disk must not add FullWait to every request).
	FullWait time.Duration

	// Linger is how long the writer waits for more entries before writing
	// a batch smaller than LingerBatch (fewer, larger transactions); it
	// never delays Flush or Close. Default 25ms; negative = no wait.
	Linger time.Duration

	// RecordLimited budget per source and event: LimitBurst entries, then
	// one per LimitEvery; entries over it are counted and summarised once
	// per Window. Defaults 10, 1s, 10s; at most MaxSources sources are
	// tracked (default 10,000; the rest share one budget per event).
	LimitBurst int
	LimitEvery time.Duration
	Window     time.Duration
	MaxSources int

	// RecordPooled's budget per pool and event, shared by all the pool's
	// sources: PoolBurst entries, then one per PoolEvery. Defaults 100,
	// 50ms (20 entries/s).
	PoolBurst int
	PoolEvery time.Duration
}

// Limits applied to every entry's Detail before any sink sees it.
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

// Defaults of Config.
const (
	DefaultQueueSize  = 16384
	DefaultFullWait   = 2 * time.Second
	DefaultLimitBurst = 10
	DefaultLimitEvery = time.Second
	DefaultWindow     = 10 * time.Second
	DefaultMaxSources = 10000
	DefaultPoolBurst  = 100
	DefaultPoolEvery  = 50 * time.Millisecond
	DefaultLinger     = 25 * time.Millisecond
	// LingerBatch is the batch size at which the writer stops lingering.
	LingerBatch = 512
)

// Log fans entries out to its sinks through a bounded queue and one writer.
// Safe for concurrent use; a nil *Log discards everything (handy in tests of
// other packages).
type Log struct {
	cfg Config

	mu       sync.Mutex
	q        []Entry       // waiting for the writer
	spare    []Entry       // the writer's last batch, reused
	writing  bool          // a writer goroutine is running
	closed   bool          // Close was called: Record only counts late entries
	space    chan struct{} // closed (and replaced) whenever the writer takes a batch
	progress chan struct{} // closed (and replaced) whenever a batch is written
	seq      int64         // entries enqueued
	written  int64         // entries the writer has handed to every sink
	idle     chan struct{} // closed when the writer exits; nil while none ran
	overflow bool          // a drop happened and the queue has not drained below half since
	dropped  overflowTally // drops not yet reported by an audit-overflow entry
	wake     chan struct{} // non-nil while the writer lingers; closed to end the wait
	hurry    int           // Flush calls waiting, or 1<<30 once Close began: no lingering

	lim limiter

	sinkFails map[int]*sinkFailLog // by sink index; the writer's only

	recorded, failures, drops, late atomic.Int64

	closeOnce sync.Once
	closeErr  error
}

// overflowTally counts dropped entries until an audit-overflow entry reports them.
type overflowTally struct {
	n      int64
	events map[string]int64
	since  int64
}

// New returns a Log. It starts no goroutine until there is something to write.
func New(cfg Config) *Log {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.FullWait <= 0 {
		cfg.FullWait = DefaultFullWait
	}
	if cfg.LimitBurst <= 0 {
		cfg.LimitBurst = DefaultLimitBurst
	}
	if cfg.LimitEvery <= 0 {
		cfg.LimitEvery = DefaultLimitEvery
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.MaxSources <= 0 {
		cfg.MaxSources = DefaultMaxSources
	}
	if cfg.PoolBurst <= 0 {
		cfg.PoolBurst = DefaultPoolBurst
	}
	if cfg.PoolEvery <= 0 {
		cfg.PoolEvery = DefaultPoolEvery
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	cfg.Sinks = append([]Sink(nil), cfg.Sinks...)
	l := &Log{cfg: cfg, space: make(chan struct{}), progress: make(chan struct{})}
	l.lim.log = l
	return l
}

// Record queues e for every sink, stamping At when zero, and returns
// without waiting for the disk. It never returns an error: a sink failure
// is counted (Failures) and logged, a full queue first holds the caller
// back (backpressure, up to Config.FullWait) and then counts the entry as
// dropped (Dropped), logs it and reports it in an audit-overflow entry.
// Record keeps e.Detail: do not change the map after the call.
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
		e.RequestID = RequestID(ctx) // put in detail.rid by sanitizeEntry, on the writer
	}
	var deadline time.Time
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			l.late.Add(1)
			b, _ := json.Marshal(sanitizeEntry(e))
			l.cfg.Logger.Error("audit: entry recorded after the audit log was closed; it is only in this log line", "entry", string(b))
			return
		}
		if len(l.q) < l.cfg.QueueSize {
			l.q = append(l.q, e)
			l.seq++
			if len(l.q) >= LingerBatch {
				l.wakeLocked()
			}
			if !l.writing {
				l.writing = true
				l.idle = make(chan struct{})
				go l.writeLoop(l.idle)
			}
			l.mu.Unlock()
			return
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(l.cfg.FullWait)
		}
		if l.overflow || !now.Before(deadline) {
			l.dropLocked(e)
			l.mu.Unlock()
			return
		}
		space := l.space
		l.mu.Unlock()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-space:
		case <-t.C:
		case <-ctx.Done():
			deadline = now // the caller gave up waiting: drop if still full
		}
		t.Stop()
	}
}

// dropLocked counts e as lost to overflow. Caller holds l.mu.
func (l *Log) dropLocked(e Entry) {
	l.drops.Add(1)
	if l.dropped.n == 0 {
		l.dropped.since = e.At
		l.dropped.events = map[string]int64{}
		l.cfg.Logger.Error("audit: queue full, entries are being dropped (they are counted in an audit-overflow entry)",
			"queue", l.cfg.QueueSize, "event", e.Event, "tid", e.TID)
	}
	l.overflow = true
	l.dropped.n++
	if len(l.dropped.events) < 64 {
		l.dropped.events[e.Event]++
	} else {
		l.dropped.events["(other)"]++
	}
}

// wakeLocked ends the writer's linger. Caller holds l.mu.
func (l *Log) wakeLocked() {
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

// writeLoop writes batches until the queue is empty, then exits.
func (l *Log) writeLoop(idle chan struct{}) {
	defer close(idle)
	for {
		l.mu.Lock()
		if l.cfg.Linger > 0 && len(l.q) < LingerBatch && l.hurry == 0 {
			// Group commit: let more entries join this batch.
			wake := make(chan struct{})
			l.wake = wake
			l.mu.Unlock()
			t := time.NewTimer(l.cfg.Linger)
			select {
			case <-t.C:
			case <-wake:
			}
			t.Stop()
			l.mu.Lock()
			l.wake = nil
		}
		if l.dropped.n > 0 && len(l.q) < l.cfg.QueueSize {
			// Report the drops in the stream itself, in order.
			l.q = append(l.q, l.overflowEntryLocked())
			l.seq++
		}
		batch := l.q
		if len(batch) <= l.cfg.QueueSize/2 {
			l.overflow = false // drained: a full queue may hold callers back again
		}
		if len(batch) == 0 {
			l.writing = false
			l.mu.Unlock()
			return
		}
		l.q = l.spare[:0]
		close(l.space)
		l.space = make(chan struct{})
		upTo := l.seq
		l.mu.Unlock()

		l.write(batch)

		clear(batch)
		l.mu.Lock()
		l.spare = batch[:0]
		l.written = upTo
		close(l.progress)
		l.progress = make(chan struct{})
		l.mu.Unlock()
	}
}

func (l *Log) overflowEntryLocked() Entry {
	d := l.dropped
	l.dropped = overflowTally{}
	ev := make(map[string]any, len(d.events))
	for k, v := range d.events {
		ev[k] = v
	}
	now := l.cfg.Clock().UnixMilli()
	l.cfg.Logger.Error("audit: entries were dropped because the queue was full", "dropped", d.n, "since", d.since)
	return Entry{At: now, Event: EventAuditOverflow, Detail: map[string]any{
		"dropped": d.n, "events": ev, "since": d.since, "until": now}}
}

// write hands one batch to every sink: encoded once, one WriteBatch call
// per BatchSink (one transaction or one write), Write per entry otherwise.
func (l *Log) write(entries []Entry) {
	b := &Batch{Entries: entries}
	for i := range entries {
		entries[i] = sanitizeEntry(entries[i])
	}
	b.encode()
	ctx := context.Background()
	for i, s := range l.cfg.Sinks {
		if bs, ok := s.(BatchSink); ok {
			if err := bs.WriteBatch(ctx, b); err != nil {
				l.failures.Add(int64(len(entries)))
				l.logSinkFailure(i, s, int64(len(entries)), entries[0], err)
			}
			continue
		}
		for _, e := range entries {
			if err := s.Write(ctx, e); err != nil {
				l.failures.Add(1)
				l.logSinkFailure(i, s, 1, e, err)
			}
		}
	}
}

// sinkFailLogEvery is how often a failing sink is logged again.
const sinkFailLogEvery = 10 * time.Second

// sinkFailLog is the throttle of one sink's failure lines.
type sinkFailLog struct {
	at      time.Time // last line
	pending int64     // entries failed since, not yet in a line
}

// logSinkFailure logs that n entries (the first of them e) were not stored
// in sink i: the first failure at once, then at most one line every
// sinkFailLogEvery with the count since the last line (Failures, the
// metrics and /readyz count every entry). A full disk used to log a line
// per batch, or per entry for a sink without batches: thousands a second,
// often onto the same full disk. Called by the writer only.
func (l *Log) logSinkFailure(i int, sink Sink, n int64, e Entry, err error) {
	if l.sinkFails == nil {
		l.sinkFails = make(map[int]*sinkFailLog)
	}
	f := l.sinkFails[i]
	now := l.cfg.Clock()
	if f == nil {
		f = &sinkFailLog{}
		l.sinkFails[i] = f
	} else if now.Sub(f.at) < sinkFailLogEvery {
		f.pending += n
		return
	}
	n += f.pending
	f.at, f.pending = now, 0
	l.cfg.Logger.Warn("audit: sink write failed; entries not stored there (logged at most every 10 s; lapd_audit_sink_failures_total counts them all)",
		"sink", fmt.Sprintf("%T", sink), "entries", n, "event", e.Event, "tid", e.TID, "err", err)
}

// Flush waits until every entry recorded before the call has been handed to
// every sink, or ctx ends. RecordLimited tallies keep counting until their
// window ends (or Close).
func (l *Log) Flush(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	l.hurry++
	l.wakeLocked()
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.hurry--
		l.mu.Unlock()
	}()
	for {
		l.mu.Lock()
		if l.written >= l.seq {
			l.mu.Unlock()
			return nil
		}
		p := l.progress
		l.mu.Unlock()
		select {
		case <-p:
		case <-ctx.Done():
			return ctx.Err()
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

// Failures reports how many entry writes to a sink have failed since New.
func (l *Log) Failures() int64 {
	if l == nil {
		return 0
	}
	return l.failures.Load()
}

// Queued reports how many entries wait for the writer now.
func (l *Log) Queued() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.q)
}

// Dropped reports how many entries were dropped because the queue stayed
// full (each is counted in an audit-overflow entry), plus entries recorded
// after Close (each is written to the Logger instead).
func (l *Log) Dropped() int64 {
	if l == nil {
		return 0
	}
	return l.drops.Load() + l.late.Load()
}

// Close writes every queued entry and pending summary, then closes every
// sink once; later calls return the first result. Entries recorded after
// Close are not stored: each is written to the Logger at error level and
// counted in Dropped. Close the Log after everything that records into it.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	l.closeOnce.Do(func() {
		l.lim.stop()
		l.lim.flush()
		// Drain: entries recorded while the writer empties the queue still
		// get in; once it is empty and idle, later ones are late.
		l.mu.Lock()
		l.hurry += 1 << 30
		l.wakeLocked()
		l.mu.Unlock()
		for {
			l.mu.Lock()
			if len(l.q) == 0 && !l.writing {
				l.closed = true
				close(l.space) // wake Records waiting for room: they see closed
				l.space = make(chan struct{})
				l.mu.Unlock()
				break
			}
			idle := l.idle
			l.mu.Unlock()
			<-idle
		}
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

// Batch is what a BatchSink receives: entries already sanitized, with their
// JSON encodings computed once for all sinks.
type Batch struct {
	Entries []Entry
	lines   [][]byte // JSONL line of each entry, without the newline
	details [][]byte // JSON of each entry's Detail ("{}" when empty)
	buf     []byte
}

// Line is entry i in the wire shape ({at, tid|null, uid|null, event, detail}),
// without a trailing newline.
func (b *Batch) Line(i int) []byte { return b.lines[i] }

// Detail is entry i's Detail as JSON ("{}" when empty).
func (b *Batch) Detail(i int) []byte { return b.details[i] }

func (b *Batch) encode() {
	b.lines = make([][]byte, len(b.Entries))
	b.details = make([][]byte, len(b.Entries))
	buf := make([]byte, 0, 256*len(b.Entries))
	for i, e := range b.Entries {
		start := len(buf)
		buf = appendLineStart(buf, e)
		dStart := len(buf)
		if out, ok := appendDetail(buf, e.Detail); ok {
			buf = out // the usual detail, written in place
		} else {
			d, err := json.Marshal(e.Detail)
			if err != nil {
				d, _ = json.Marshal(map[string]string{"unencodable": err.Error()})
			}
			buf = append(buf[:dStart], d...)
		}
		dEnd := len(buf)
		buf = append(buf, '}')
		b.lines[i] = buf[start:len(buf):len(buf)]
		b.details[i] = buf[dStart:dEnd:dEnd]
	}
	b.buf = buf
}

// appendDetail appends d as json.Marshal writes it ("{}" when empty: keys
// sorted, strings HTML-escaped) when every value is a string, bool, int,
// int64 or nil, the detail lapd's routes record; ok is false otherwise, and
// the caller uses json.Marshal.
func appendDetail(buf []byte, d map[string]any) ([]byte, bool) {
	if len(d) == 0 {
		return append(buf, "{}"...), true
	}
	var arr [8]string
	keys := arr[:0]
	for k, v := range d {
		switch v.(type) {
		case string, bool, int, int64, nil:
		default:
			return buf, false
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	buf = append(buf, '{')
	for i, k := range keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendString(buf, k)
		buf = append(buf, ':')
		switch v := d[k].(type) {
		case string:
			buf = appendString(buf, v)
		case bool:
			buf = strconv.AppendBool(buf, v)
		case int:
			buf = strconv.AppendInt(buf, int64(v), 10)
		case int64:
			buf = strconv.AppendInt(buf, v, 10)
		case nil:
			buf = append(buf, "null"...)
		}
	}
	return append(buf, '}'), true
}

// appendLineStart appends e's wire shape up to its detail.
func appendLineStart(buf []byte, e Entry) []byte {
	buf = append(buf, `{"at":`...)
	buf = strconv.AppendInt(buf, e.At, 10)
	buf = append(buf, `,"tid":`...)
	buf = appendNullString(buf, e.TID)
	buf = append(buf, `,"uid":`...)
	buf = appendNullString(buf, e.UID)
	buf = append(buf, `,"event":`...)
	buf = appendString(buf, e.Event)
	return append(buf, `,"detail":`...)
}

func appendNullString(buf []byte, s string) []byte {
	if s == "" {
		return append(buf, "null"...)
	}
	return appendString(buf, s)
}

func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' || c >= utf8.RuneSelf {
			b, _ := json.Marshal(s)
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// sanitizeEntry returns e with a sanitized copy of its Detail, or with its
// own Detail when nothing in it needs a change (the usual case: no copy).
func sanitizeEntry(e Entry) Entry {
	rid := e.RequestID != "" && ValidRequestID(e.RequestID)
	if rid || !cleanMap(e.Detail, 0) {
		e.Detail = sanitizeMap(e.Detail, 0) // a copy: the caller's map is never changed
	}
	if rid {
		if e.Detail == nil {
			e.Detail = map[string]any{}
		}
		e.Detail["rid"] = e.RequestID
	}
	return e
}

// cleanMap reports whether sanitizeMap would return m unchanged: only
// strings (without secrets, within MaxDetailString), numbers, booleans, nil
// and nested map[string]any / []any of those, within MaxDetailDepth.
func cleanMap(m map[string]any, depth int) bool {
	for _, v := range m {
		if !cleanValue(v, depth+1) {
			return false
		}
	}
	return true
}

func cleanValue(v any, depth int) bool {
	if depth > MaxDetailDepth {
		return false
	}
	switch v := v.(type) {
	case nil, bool, int, int64, float64, uint64, int32:
		return true
	case string:
		return len(v) <= MaxDetailString && redact.String(v) == v
	case map[string]any:
		return cleanMap(v, depth)
	case []any:
		for _, x := range v {
			if !cleanValue(x, depth+1) {
				return false
			}
		}
		return true
	}
	return false // converted by sanitizeValue (string maps, errors, Stringers…)
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
	case map[string]int64:
		out := make(map[string]any, len(v))
		for k, n := range v {
			out[k] = n
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
