package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lapd-dev/lapd/audit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memSink keeps entries in memory; fail makes every Write fail.
type memSink struct {
	mu      sync.Mutex
	entries []audit.Entry
	fail    error
	closed  int
}

func (s *memSink) Write(_ context.Context, e audit.Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.entries = append(s.entries, e)
	return nil
}

func (s *memSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed++
	return s.fail
}

func (s *memSink) all() []audit.Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]audit.Entry(nil), s.entries...)
}

// flush waits until l has written everything recorded so far.
func flush(t *testing.T, l *audit.Log) {
	t.Helper()
	if err := l.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// closeLog closes l (writing everything queued) and fails on an error.
func closeLog(t *testing.T, l *audit.Log) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestEntryWireShape(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		e    audit.Entry
		want string
	}{
		{"anonymous, no detail",
			audit.Entry{At: 1700000000123, Event: audit.EventRevoke},
			`{"at":1700000000123,"tid":null,"uid":null,"event":"revoke","detail":{}}`},
		{"tid only",
			audit.Entry{At: 5, TID: "3f1c", Event: audit.EventClaim, Detail: map[string]any{"transport": "ws", "repair": false}},
			`{"at":5,"tid":"3f1c","uid":null,"event":"claim","detail":{"repair":false,"transport":"ws"}}`},
		{"tid and uid",
			audit.Entry{At: 5, TID: "t", UID: "alice", Event: audit.EventMint, Detail: map[string]any{"origin": "https://app.example"}},
			`{"at":5,"tid":"t","uid":"alice","event":"mint","detail":{"origin":"https://app.example"}}`},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		l := audit.New(audit.Config{Sinks: []audit.Sink{audit.NewJSONLSink(&buf)}})
		l.Record(t.Context(), tt.e)
		closeLog(t, l)
		if got := buf.String(); got != tt.want+"\n" {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
}

func TestRecordStampsAt(t *testing.T) {
	t.Parallel()
	now := time.UnixMilli(1_800_000_000_456)
	sink := &memSink{}
	l := audit.New(audit.Config{Sinks: []audit.Sink{sink}, Clock: func() time.Time { return now }})
	l.Record(t.Context(), audit.Entry{Event: audit.EventMint})
	l.Record(t.Context(), audit.Entry{At: 42, Event: audit.EventLapCall})
	closeLog(t, l)
	got := sink.all()
	if len(got) != 2 || got[0].At != now.UnixMilli() || got[1].At != 42 {
		t.Errorf("entries = %+v", got)
	}
	if l.Recorded() != 2 {
		t.Errorf("Recorded = %d", l.Recorded())
	}
}

func TestRecordRedactsTokens(t *testing.T) {
	t.Parallel()
	const tok = "agt_Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy"
	sink := &memSink{}
	var buf bytes.Buffer
	l := audit.New(audit.Config{Sinks: []audit.Sink{sink, audit.NewJSONLSink(&buf)}})
	detail := map[string]any{
		"token":  tok,
		"nested": map[string]any{"bearer": tok, "deeper": []any{tok, 3}},
		"strs":   []string{"ok", tok},
		"smap":   map[string]string{"t": tok},
		"err":    fmt.Errorf("%s", tok),
		"inside": fmt.Errorf("dial ws://h/agent/ws?token=%s: refused", tok),
		"fine":   "a sentence that mentions agt_ is fine",
		"n":      7,
	}
	l.Record(t.Context(), audit.Entry{At: 1, Event: audit.EventLapCall, Detail: detail})
	closeLog(t, l)
	const r = "agt_…redacted"
	want := map[string]any{
		"token":  r,
		"nested": map[string]any{"bearer": r, "deeper": []any{r, 3}},
		"strs":   []any{"ok", r},
		"smap":   map[string]any{"t": r},
		"err":    r,
		"inside": "dial ws://h/agent/ws?token=" + r + ": refused",
		"fine":   "a sentence that mentions agt_ is fine",
		"n":      7,
	}
	if got := sink.all()[0].Detail; !reflect.DeepEqual(got, want) {
		t.Errorf("detail reaching the sink = %#v\nwant %#v", got, want)
	}
	if strings.Contains(buf.String(), tok) {
		t.Errorf("the token reached the JSONL sink: %s", buf.String())
	}
	if detail["token"] != tok {
		t.Error("Record modified the caller's detail map")
	}
}

func TestRecordCapsLongStrings(t *testing.T) {
	t.Parallel()
	sink := &memSink{}
	l := audit.New(audit.Config{Sinks: []audit.Sink{sink}})
	long := strings.Repeat("é", audit.MaxDetailString) // 2 bytes each
	l.Record(t.Context(), audit.Entry{Event: audit.EventLapCall, Detail: map[string]any{"intent": long}})
	closeLog(t, l)
	got := sink.all()[0].Detail["intent"].(string)
	if len(got) > audit.MaxDetailString+len("…") || !strings.HasSuffix(got, "…") || !strings.HasPrefix(long, strings.TrimSuffix(got, "…")) {
		t.Errorf("capped string has %d bytes: %.40q…", len(got), got)
	}
}

// A failing sink is logged at once, then at most every 10 s with the count
// since (it was a line per batch, or per entry: thousands a second on a
// full disk); Failures counts every entry.
func TestFailingSinkIsCountedAndLogged(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	bad := &memSink{fail: errors.New("disk full")}
	good := &memSink{}
	var mu sync.Mutex
	now := time.Unix(1700000000, 0)
	l := audit.New(audit.Config{
		Sinks:  []audit.Sink{bad, good},
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		Clock:  func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
	})
	for range 3 {
		l.Record(t.Context(), audit.Entry{TID: "t1", Event: audit.EventMint})
		flush(t, l) // one batch each
	}
	mu.Lock()
	now = now.Add(10 * time.Second)
	mu.Unlock()
	l.Record(t.Context(), audit.Entry{TID: "t2", Event: audit.EventClaim})
	flush(t, l)
	if l.Failures() != 4 {
		t.Errorf("Failures = %d, want 4", l.Failures())
	}
	if n := len(good.all()); n != 4 {
		t.Errorf("the healthy sink got %d entries, want 4", n)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want a warning at the first failure and one 10 s later, got %d lines:\n%s", len(lines), logs.String())
	}
	for i, want := range []struct {
		event   string
		entries float64
	}{{"mint", 1}, {"claim", 3}} {
		var rec map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &rec); err != nil {
			t.Fatal(err)
		}
		if rec["level"] != "WARN" || rec["sink"] != "*audit_test.memSink" || rec["err"] != "disk full" || rec["event"] != want.event || rec["entries"] != want.entries {
			t.Errorf("warning %d = %v, want event %s, entries %v", i, rec, want.event, want.entries)
		}
	}
}

func TestNilLog(t *testing.T) {
	t.Parallel()
	var l *audit.Log
	l.Record(t.Context(), audit.Entry{Event: audit.EventMint})
	if l.Failures() != 0 || l.Recorded() != 0 || l.Close() != nil {
		t.Error("a nil *Log must discard quietly")
	}
	l2 := audit.New(audit.Config{}) // no sinks
	l2.Record(t.Context(), audit.Entry{Event: audit.EventMint})
	closeLog(t, l2)
}

func TestCloseClosesEverySinkOnce(t *testing.T) {
	t.Parallel()
	a, b := &memSink{}, &memSink{fail: errors.New("boom")}
	l := audit.New(audit.Config{Sinks: []audit.Sink{a, b}})
	err := l.Close()
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("Close = %v, want the failing sink's error", err)
	}
	if err2 := l.Close(); err2 != err {
		t.Errorf("second Close = %v, want the first result", err2)
	}
	if a.closed != 1 || b.closed != 1 {
		t.Errorf("closed %d and %d times, want once each", a.closed, b.closed)
	}
}

func TestConcurrentRecord(t *testing.T) {
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
	l := audit.New(audit.Config{Sinks: []audit.Sink{file, db, audit.NewJSONLSink(&stream)}})
	defer l.Close()
	const workers, each = 50, 20
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				l.Record(t.Context(), audit.Entry{TID: fmt.Sprint("t", w), Event: audit.EventLapCall,
					Detail: map[string]any{"i": i, "pad": strings.Repeat("x", 500)}})
			}
		})
	}
	wg.Wait()
	flush(t, l)
	if l.Failures() != 0 {
		t.Fatalf("Failures = %d", l.Failures())
	}
	for _, q := range []audit.Querier{file, db} {
		es, err := q.Query(t.Context(), audit.Filter{})
		if err != nil || len(es) != workers*each {
			t.Errorf("%T: %d entries, %v; want %d", q, len(es), err, workers*each)
		}
		es, _ = q.Query(t.Context(), audit.Filter{TID: "t7"})
		if len(es) != each {
			t.Errorf("%T: %d entries of t7, want %d", q, len(es), each)
		}
	}
	if file.Skipped() != 0 {
		t.Errorf("interleaved writes: %d malformed lines", file.Skipped())
	}
	es, skipped, err := audit.ScanJSONL(t.Context(), &stream.buf, audit.Filter{})
	if err != nil || skipped != 0 || len(es) != workers*each {
		t.Errorf("stream: %d entries, %d skipped, %v", len(es), skipped, err)
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func TestFormatText(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 23, 10, 0, 0, 123e6, time.UTC).UnixMilli()
	tests := []struct {
		e    audit.Entry
		want string
	}{
		{audit.Entry{At: at, TID: "3f1c", UID: "alice", Event: audit.EventMint, Detail: map[string]any{"origin": "https://a.example/<x>"}},
			`2026-11-23T10:00:00.123Z  mint  tid=3f1c  uid=alice  {"origin":"https://a.example/<x>"}`},
		{audit.Entry{At: at, Event: audit.EventRevoke},
			`2026-11-23T10:00:00.123Z  revoke  tid=-  uid=-  {}`},
		{audit.Entry{At: at, TID: "t", Event: audit.EventLapCall, Detail: map[string]any{"path": "/agent/lap/v1/observe", "b": 1}},
			`2026-11-23T10:00:00.123Z  lap-call  tid=t  uid=-  {"b":1,"path":"/agent/lap/v1/observe"}`},
	}
	for _, tt := range tests {
		if got := audit.FormatText(tt.e); got != tt.want {
			t.Errorf("FormatText =\n %s\nwant\n %s", got, tt.want)
		}
	}
}
