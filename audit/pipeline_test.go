package audit_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lapd-dev/lapd/audit"
)

// batchSink is a BatchSink that records each batch's size and can be held:
// while hold is set, WriteBatch waits for a value on release.
type batchSink struct {
	mu      sync.Mutex
	sizes   []int
	entries []audit.Entry
	hold    bool
	release chan struct{}
	entered chan struct{} // gets a value each time WriteBatch starts
}

func newBatchSink() *batchSink {
	return &batchSink{release: make(chan struct{}), entered: make(chan struct{}, 1000)}
}

func (s *batchSink) Write(context.Context, audit.Entry) error {
	panic("the Log must call WriteBatch on a BatchSink")
}

func (s *batchSink) WriteBatch(_ context.Context, b *audit.Batch) error {
	s.entered <- struct{}{}
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	if hold {
		<-s.release
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sizes = append(s.sizes, len(b.Entries))
	s.entries = append(s.entries, b.Entries...)
	return nil
}

func (s *batchSink) Close() error { return nil }

func (s *batchSink) setHold(v bool) {
	s.mu.Lock()
	s.hold = v
	s.mu.Unlock()
}

func (s *batchSink) all() []audit.Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]audit.Entry(nil), s.entries...)
}

// TestGroupCommit: while the writer is busy with one batch, everything
// recorded meanwhile becomes the next batch (one WriteBatch call), and
// Record never waits for the sink.
func TestGroupCommit(t *testing.T) {
	t.Parallel()
	s := newBatchSink()
	s.setHold(true)
	l := audit.New(audit.Config{Sinks: []audit.Sink{s}})
	l.Record(t.Context(), audit.Entry{Event: audit.EventMint})
	<-s.entered // the writer is inside the first batch, held
	for i := range 100 {
		l.Record(t.Context(), audit.Entry{Event: audit.EventLapCall, Detail: map[string]any{"i": i}})
	}
	s.setHold(false)
	s.release <- struct{}{}
	closeLog(t, l)
	if fmt.Sprint(s.sizes) != "[1 100]" {
		t.Errorf("batch sizes %v, want [1 100]", s.sizes)
	}
	if n := len(s.all()); n != 101 || l.Dropped() != 0 {
		t.Errorf("%d entries stored, %d dropped", n, l.Dropped())
	}
}

// TestNoEntryLostUnderLoadAndClose: 32 writers record as fast as they can
// into a real SQLite sink, a JSONL file and a stream through a queue far
// smaller than the load, and the log is closed as soon as they are done:
// every entry is in every sink, once, and the writer goroutine is gone
// (goleak in TestMain).
func TestNoEntryLostUnderLoadAndClose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file, err := audit.OpenJSONLFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := audit.OpenSQLiteSink(filepath.Join(dir, "lapd.db"))
	if err != nil {
		t.Fatal(err)
	}
	var stream lockedBuffer
	// A small queue, so that writers are held back (backpressure) most of
	// the time; FullWait long enough that holding back always wins.
	l := audit.New(audit.Config{Sinks: []audit.Sink{file, db, audit.NewJSONLSink(&stream)}, QueueSize: 256, FullWait: time.Minute})
	const workers, each = 32, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				l.Record(t.Context(), audit.Entry{TID: fmt.Sprint("t", w), Event: audit.EventLapCall, Detail: map[string]any{"i": i}})
			}
		})
	}
	wg.Wait()
	closeLog(t, l)
	if l.Dropped() != 0 || l.Failures() != 0 {
		t.Fatalf("dropped %d, failures %d", l.Dropped(), l.Failures())
	}
	// Reopen to read what is on disk after Close.
	file2, err := audit.OpenJSONLFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer file2.Close()
	db2, err := audit.OpenSQLiteSink(filepath.Join(dir, "lapd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	for _, q := range []audit.Querier{file2, db2} {
		es, err := q.Query(t.Context(), audit.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range es {
			k := fmt.Sprint(e.TID, "/", e.Detail["i"])
			if seen[k] {
				t.Fatalf("%T: %s stored twice", q, k)
			}
			seen[k] = true
		}
		if len(seen) != workers*each {
			t.Errorf("%T: %d distinct entries, want %d", q, len(seen), workers*each)
		}
	}
	es, skipped, err := audit.ScanJSONL(t.Context(), &stream.buf, audit.Filter{})
	if err != nil || skipped != 0 || len(es) != workers*each {
		t.Errorf("stream: %d entries, %d skipped, %v", len(es), skipped, err)
	}
}

// TestBackpressureThenOverflow: a full queue holds Record back until the
// writer makes room (nothing lost); when the sink stays stuck past
// FullWait, entries are dropped, counted, logged, and reported in an
// audit-overflow entry once the sink recovers.
func TestBackpressureThenOverflow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs lockedBuffer
		s := newBatchSink()
		s.setHold(true)
		l := audit.New(audit.Config{Sinks: []audit.Sink{s}, QueueSize: 2, FullWait: time.Second,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		l.Record(t.Context(), audit.Entry{Event: audit.EventMint})
		<-s.entered // batch 1 held; the queue (2) is empty
		l.Record(t.Context(), audit.Entry{Event: audit.EventLapCall})
		l.Record(t.Context(), audit.Entry{Event: audit.EventLapCall})
		// Full: this one waits for room (backpressure)...
		done := make(chan struct{})
		go func() {
			l.Record(context.Background(), audit.Entry{Event: audit.EventClaim})
			close(done)
		}()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("Record returned while the queue was full and FullWait had not passed")
		default:
		}
		// ...and gets in when the writer takes the next batch.
		s.release <- struct{}{}
		<-s.entered // batch 2 (the two lap-calls) held
		<-done
		if l.Dropped() != 0 {
			t.Fatalf("dropped %d while only waiting", l.Dropped())
		}
		// Queue now: [claim]. Fill it and stay stuck past FullWait.
		l.Record(t.Context(), audit.Entry{Event: audit.EventRevoke})
		start := time.Now()
		l.Record(t.Context(), audit.Entry{Event: audit.EventRevoke, TID: "lost-1"})
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("waited %v for room, want FullWait (1s)", waited)
		}
		// In overflow now: the next drop does not wait again.
		start = time.Now()
		l.Record(t.Context(), audit.Entry{Event: audit.EventMint, TID: "lost-2"})
		if waited := time.Since(start); waited != 0 {
			t.Errorf("second drop waited %v", waited)
		}
		if l.Dropped() != 2 {
			t.Errorf("Dropped = %d, want 2", l.Dropped())
		}
		s.setHold(false)
		s.release <- struct{}{}
		closeLog(t, l)
		var over []audit.Entry
		for _, e := range s.all() {
			if e.TID == "lost-1" || e.TID == "lost-2" {
				t.Errorf("a dropped entry was stored: %+v", e)
			}
			if e.Event == audit.EventAuditOverflow {
				over = append(over, e)
			}
		}
		if len(over) != 1 || over[0].Detail["dropped"] != int64(2) {
			t.Fatalf("overflow entries %+v", over)
		}
		if ev := over[0].Detail["events"].(map[string]any); ev["mint"] != int64(1) || ev["revoke"] != int64(1) {
			t.Errorf("overflow events %v, want mint:1 revoke:1", ev)
		}
		if !strings.Contains(logs.buf.String(), "queue full") {
			t.Errorf("no error log for the drops:\n%s", logs.buf.String())
		}
		if n := len(s.all()); n != 6 { // mint, 2 lap-call, claim, revoke, audit-overflow
			t.Errorf("%d entries stored, want 6: %+v", n, s.all())
		}
	})
}

// TestRecordAfterClose is not stored but logged with its content and counted.
func TestRecordAfterClose(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	s := newBatchSink()
	l := audit.New(audit.Config{Sinks: []audit.Sink{s}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	closeLog(t, l)
	l.Record(t.Context(), audit.Entry{TID: "t9", Event: audit.EventDisconnect})
	if l.Dropped() != 1 || len(s.all()) != 0 {
		t.Errorf("dropped %d, stored %d", l.Dropped(), len(s.all()))
	}
	if !strings.Contains(logs.buf.String(), `\"tid\":\"t9\"`) {
		t.Errorf("the late entry is not in the log:\n%s", logs.buf.String())
	}
}

// TestRecordLimited: a source gets LimitBurst entries, then one per
// LimitEvery; the rest are summarised once per Window with a count, and
// other sources keep their own budget.
func TestRecordLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBatchSink()
		l := audit.New(audit.Config{Sinks: []audit.Sink{s}, LimitBurst: 3, LimitEvery: time.Second, Window: 10 * time.Second})
		refusal := func(src string) {
			l.RecordLimited(t.Context(), src, audit.Entry{Event: audit.EventAuthFailed,
				Detail: map[string]any{"endpoint": "/agent/lap/v1/observe", "status": 401}})
		}
		for range 50 {
			refusal("192.0.2.1")
		}
		refusal("192.0.2.2")
		flush(t, l) // Flush does not end a window
		if got := len(s.all()); got != 4 {
			t.Fatalf("%d entries before the window ends, want 3 + 1", got)
		}
		time.Sleep(10 * time.Second) // the window ends: one summary
		synctest.Wait()
		flush(t, l)
		es := s.all()
		if len(es) != 5 {
			t.Fatalf("%d entries, want 5: %+v", len(es), es)
		}
		sum := es[4]
		if sum.Event != audit.EventAuthFailed || sum.Detail["aggregated"] != int64(47) || sum.Detail["budget"] != "192.0.2.1" ||
			sum.Detail["endpoint"] != "/agent/lap/v1/observe" || sum.Detail["until"].(int64)-sum.Detail["since"].(int64) != 10000 {
			t.Errorf("summary %+v", sum.Detail)
		}
		// 10s later the budget is full again: entries are written at once.
		refusal("192.0.2.1")
		flush(t, l)
		if n := len(s.all()); n != 6 {
			t.Errorf("%d entries after the budget refilled, want 6", n)
		}
		closeLog(t, l)
	})
}

// TestRecordPooled: sources sharing a pool get their own budget and, all
// together, the pool's: past either, entries are counted in the pool's
// tally, one summary per Window however many sources flood (review M3:
// 1,000 tabs with a budget each wrote ~1,800 entries/s).
func TestRecordPooled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBatchSink()
		l := audit.New(audit.Config{Sinks: []audit.Sink{s}, LimitBurst: 3, LimitEvery: time.Second, Window: 10 * time.Second,
			PoolBurst: 20, PoolEvery: 100 * time.Millisecond})
		logs := func(sources, each int) {
			for i := range sources {
				for range each {
					l.RecordPooled(t.Context(), fmt.Sprint("tab:", i), "client-log", audit.Entry{TID: fmt.Sprint(i), Event: audit.EventLapCall,
						Detail: map[string]any{"source": "client-log", "kind": "read"}})
				}
			}
		}
		logs(100, 5) // 500 entries; 300 within the tabs' budgets, 20 within the pool's
		flush(t, l)
		if got := len(s.all()); got != 20 {
			t.Fatalf("%d entries before the window ends, want the pool's burst, 20", got)
		}
		time.Sleep(10 * time.Second) // the window ends: one summary for all sources
		synctest.Wait()
		flush(t, l)
		es := s.all()
		if len(es) != 21 {
			t.Fatalf("%d entries, want 21", len(es))
		}
		if sum := es[20]; sum.Detail["aggregated"] != int64(480) || sum.Detail["budget"] != "client-log" || sum.Detail["kind"] != "read" {
			t.Errorf("summary %+v", sum.Detail)
		}
		// 10 s later the pool has refilled (one per 100 ms, up to 20):
		// 100 sources × 1 second of their own budget each gets 20 through.
		logs(100, 1)
		flush(t, l)
		if got := len(s.all()); got != 41 {
			t.Errorf("%d entries after the pool refilled, want 41", got)
		}
		closeLog(t, l)
	})
}

// A budget runs on the Log's clock, not on the entries' At, which may come
// from a client: an At leaping ahead does not refill it.
func TestRecordLimitedIgnoresAt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newBatchSink()
		l := audit.New(audit.Config{Sinks: []audit.Sink{s}, LimitBurst: 3, LimitEvery: time.Second, Window: 10 * time.Second})
		at := time.Now().UnixMilli()
		for range 50 {
			at += 10_000 // as if 10 s had passed since the last entry
			l.RecordLimited(t.Context(), "tab:1", audit.Entry{At: at, TID: "1", Event: audit.EventLapCall})
		}
		flush(t, l)
		if got := len(s.all()); got != 3 {
			t.Errorf("%d entries, want the burst, 3", got)
		}
		closeLog(t, l)
	})
}

// TestSQLiteRetention: entries older than MaxAge go, and the table stays
// under about MaxBytes.
func TestSQLiteRetention(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, err := audit.OpenSQLiteSink(filepath.Join(dir, "lapd.db"))
	if err != nil {
		t.Fatal(err)
	}
	db.SetRetention(audit.Retention{MaxAge: 30 * 24 * time.Hour, MaxBytes: 200 << 10})
	l := audit.New(audit.Config{Sinks: []audit.Sink{db}})
	now := time.Now()
	for i := range 10 {
		l.Record(t.Context(), audit.Entry{At: now.Add(-31 * 24 * time.Hour).UnixMilli(), TID: "old", Event: audit.EventMint, Detail: map[string]any{"i": i}})
	}
	for i := range 10 {
		l.Record(t.Context(), audit.Entry{TID: "new", Event: audit.EventMint, Detail: map[string]any{"i": i}})
	}
	flush(t, l)
	es, err := db.Query(t.Context(), audit.Filter{})
	if err != nil || len(es) != 10 || es[0].TID != "new" {
		t.Fatalf("after the age prune: %d entries (%v)", len(es), err)
	}
	closeLog(t, l)

	// Size: 1,000 entries of ~1 KiB into a 200 KiB budget.
	db2, err := audit.OpenSQLiteSink(filepath.Join(dir, "size.db"))
	if err != nil {
		t.Fatal(err)
	}
	db2.SetRetention(audit.Retention{MaxBytes: 200 << 10})
	l2 := audit.New(audit.Config{Sinks: []audit.Sink{db2}, QueueSize: 2000})
	l2.Record(t.Context(), audit.Entry{Event: audit.EventMint})
	for i := range 1000 {
		l2.Record(t.Context(), audit.Entry{Event: audit.EventLapCall, Detail: map[string]any{"i": i, "pad": strings.Repeat("x", 1000)}})
	}
	flush(t, l2)
	es, err = db2.Query(t.Context(), audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) > 200 || len(es) < 100 {
		t.Errorf("%d entries of ~1.1 KB kept under a 200 KiB budget", len(es))
	}
	if last := es[len(es)-1]; last.Detail["i"] != float64(999) {
		t.Errorf("the newest entry is gone: %+v", last.Detail["i"])
	}
	closeLog(t, l2)
}

// TestJSONLRotation: a file sink with MaxBytes rotates to PATH.1, keeps the
// two files under about MaxBytes, and Query reads both in order.
func TestJSONLRotation(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	f, err := audit.OpenJSONLFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f.SetRetention(audit.Retention{MaxBytes: 64 << 10})
	l := audit.New(audit.Config{Sinks: []audit.Sink{f}})
	for i := range 500 {
		l.Record(t.Context(), audit.Entry{Event: audit.EventLapCall, Detail: map[string]any{"i": i, "pad": strings.Repeat("y", 500)}})
		if i%10 == 9 {
			flush(t, l)
		}
	}
	flush(t, l)
	a, _ := os.Stat(path)
	b, err := os.Stat(path + ".1")
	if err != nil {
		t.Fatalf("no rotated file: %v", err)
	}
	if total := a.Size() + b.Size(); total > 64<<10+10*600 {
		t.Errorf("files hold %d bytes, budget 64 KiB", total)
	}
	es, err := f.Query(t.Context(), audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(es); i++ {
		if es[i].Detail["i"].(float64) != es[i-1].Detail["i"].(float64)+1 {
			t.Fatalf("entries out of order at %d", i)
		}
	}
	if last := es[len(es)-1].Detail["i"]; last != float64(499) {
		t.Errorf("newest entry %v", last)
	}
	closeLog(t, l)
}
