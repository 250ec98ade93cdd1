package lap

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestIdempotency(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	im := newIdempotency(time.Minute, 2, 1<<20, 1<<20, func() time.Time { return now })
	ctx := context.Background()
	runs := 0
	ok := func(v string) func() (any, *apiError) {
		return func() (any, *apiError) { runs++; return v, nil }
	}
	str := func(v any) string { b, _ := v.(json.RawMessage); return string(b) }
	refused := func() (any, *apiError) { runs++; return nil, errf(http.StatusServiceUnavailable, CodePaused, "") }

	if v, _ := im.do(ctx, "t", "a", ok("1")); str(v) != `"1"` {
		t.Fatal(v)
	}
	if v, _ := im.do(ctx, "t", "a", ok("2")); str(v) != `"1"` || runs != 1 {
		t.Errorf("repeat ran again: %v runs=%d", v, runs)
	}
	if v, _ := im.do(ctx, "u", "a", ok("3")); str(v) != `"3"` {
		t.Errorf("keys are per tid: %v", v)
	}
	// a failure before the tab could act is not remembered
	if _, e := im.do(ctx, "t", "f", refused); e == nil {
		t.Fatal("want error")
	}
	if v, _ := im.do(ctx, "t", "f", ok("4")); str(v) != `"4"` {
		t.Errorf("after failure: %v", v)
	}
	// per-tid cap evicts the oldest finished key
	if v, _ := im.do(ctx, "t", "g", ok("5")); str(v) != `"5"` {
		t.Errorf("over cap: %v", v)
	}
	if n := len(im.m["t"].keys); n > 2 {
		t.Errorf("%d keys kept", n)
	}
	// expiry
	now = now.Add(2 * time.Minute)
	if v, _ := im.do(ctx, "u", "a", ok("6")); str(v) != `"6"` {
		t.Errorf("after ttl: %v", v)
	}
	im.drop("t")
	im.drop("u")
	if keys, bytes, _ := im.stats(); keys != 0 || bytes != 0 {
		t.Errorf("%d keys, %d bytes after drop", keys, bytes)
	}
}

// A first call that reached the tab without an answer (503 paused after the
// frame was sent, 504 timeout, 503 shutting-down) is never dispatched again
// for its key: the repeat is told outcome-unknown. Before, any non-200 forgot
// the key and the MCP executor's retry dispatched a second time.
func TestIdempotencyOutcomeUnknown(t *testing.T) {
	t.Parallel()
	im := newIdempotency(time.Minute, 10, 1<<20, 1<<20, time.Now)
	ctx := context.Background()
	for _, first := range []*apiError{
		{status: http.StatusServiceUnavailable, code: CodePaused, inDoubt: true},
		{status: http.StatusGatewayTimeout, code: CodeTimeout, inDoubt: true},
		{status: http.StatusServiceUnavailable, code: CodeShuttingDown, inDoubt: true},
	} {
		key := "k-" + first.code
		runs := 0
		fn := func() (any, *apiError) {
			runs++
			if runs == 1 {
				return nil, first
			}
			return json.RawMessage(`{"status":"dispatched"}`), nil
		}
		if _, e := im.do(ctx, "t", key, fn); e != first {
			t.Fatalf("%s: first call: %v", first.code, e)
		}
		_, e := im.do(ctx, "t", key, fn)
		if runs != 1 || e == nil || e.status != http.StatusConflict || e.code != CodeOutcomeUnknown || !strings.Contains(e.detail, "observe before retrying") {
			t.Errorf("%s: retry ran %d times, answered %+v; want 409 outcome-unknown without a second run", first.code, runs, e)
		}
	}
}

// Remembered bodies are counted in bytes, per tid and in all; a body over
// budget is shed from the session holding the most, and its key then
// answers outcome-unknown (never a second dispatch).
func TestIdempotencyByteBudgets(t *testing.T) {
	t.Parallel()
	im := newIdempotency(time.Minute, 1000, 10_000, 25_000, time.Now)
	ctx := context.Background()
	body := func(n int) func() (any, *apiError) {
		return func() (any, *apiError) { return json.RawMessage(`"` + strings.Repeat("x", n) + `"`), nil }
	}
	// victim: one small outcome
	if _, e := im.do(ctx, "victim", "v", body(100)); e != nil {
		t.Fatal(e)
	}
	// attacker: many big outcomes on several tids
	for i := range 30 {
		tid := "attacker-" + string(rune('a'+i%3))
		if _, e := im.do(ctx, tid, "k"+string(rune('A'+i)), body(4000)); e != nil {
			t.Fatal(e)
		}
	}
	_, bytes, shed := im.stats()
	if bytes > 25_000 || shed == 0 {
		t.Errorf("%d bytes kept, %d shed; want ≤ 25000 and some shed", bytes, shed)
	}
	for tid, x := range im.m {
		if x.bytes > 10_000 {
			t.Errorf("%s keeps %d bytes, over its 10000", tid, x.bytes)
		}
	}
	v, e := im.do(ctx, "victim", "v", body(1))
	if e != nil || len(v.(json.RawMessage)) != 102 {
		t.Errorf("the victim's outcome was evicted by other sessions: %v %v", v, e)
	}
	// the attacker's first key was shed: its repeat is not dispatched again
	ran := false
	_, e = im.do(ctx, "attacker-a", "kA", func() (any, *apiError) { ran = true; return json.RawMessage(`1`), nil })
	if ran || e == nil || e.code != CodeOutcomeUnknown {
		t.Errorf("shed key: ran=%v err=%v, want outcome-unknown", ran, e)
	}
}

// Other sessions filling the table (the review: many anonymous tokens,
// keyed /message calls up to the 50,000 keys) do not refuse a fresh
// session's key: the oldest finished key of the session holding the most
// makes room. Before, a session with no keys got 429 "too many idempotency
// keys in flight for this session" for as long as the others' keys lived.
func TestIdempotencyTableFullOtherSessions(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	im := newIdempotency(time.Minute, 4, 1<<20, 1<<20, func() time.Time { return now })
	im.maxTotal = 6
	ctx := context.Background()
	ok := func(v string) func() (any, *apiError) {
		return func() (any, *apiError) { return json.RawMessage(v), nil }
	}
	for i, tk := range []struct{ tid, key string }{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}, {"a", "a3"}, {"b", "b2"}, {"a", "a4"}} {
		now = now.Add(time.Second)
		if _, e := im.do(ctx, tk.tid, tk.key, ok(`1`)); e != nil {
			t.Fatalf("filling, call %d: %v", i, e)
		}
	}
	if keys, _, _ := im.stats(); keys != 6 {
		t.Fatalf("%d keys, want the table full (6)", keys)
	}
	for i, key := range []string{"c1", "c2"} {
		now = now.Add(time.Second)
		if v, e := im.do(ctx, "c", key, ok(`"fresh"`)); e != nil || string(v.(json.RawMessage)) != `"fresh"` {
			t.Fatalf("fresh session's key %d refused though it holds the fewest: %v %v", i, v, e)
		}
	}
	if keys, _, _ := im.stats(); keys != 6 {
		t.Errorf("%d keys kept, want the table's 6", keys)
	}
	// a (4 keys, then 3) was the heaviest both times: it gave up a1, a2.
	for key, want := range map[string]bool{"a1": false, "a2": false, "a3": true, "a4": true} {
		if _, has := im.m["a"].keys[key]; has != want {
			t.Errorf("a keeps %s: %v, want %v (its oldest go first)", key, has, want)
		}
	}
	if n := len(im.m["b"].keys); n != 2 {
		t.Errorf("b keeps %d keys, want its 2 (a was heavier)", n)
	}
	// Now a, b and c hold 2 each: c's next key would make it the heaviest,
	// so it gives up its own oldest, not another session's.
	if _, e := im.do(ctx, "c", "c3", ok(`1`)); e != nil {
		t.Fatalf("c's third key: %v", e)
	}
	if _, has := im.m["c"].keys["c1"]; has {
		t.Error("c, about to hold the most, took another session's place")
	}
	if len(im.m["a"].keys) != 2 || len(im.m["b"].keys) != 2 {
		t.Errorf("a keeps %d, b %d keys; want 2 each", len(im.m["a"].keys), len(im.m["b"].keys))
	}
}

// A key in flight is never evicted, by its own session's cap or by the
// table's: its repeat waits for it and gets its answer, never a second run.
// When every key is in flight, a new one is refused with a message that does
// not blame the caller's session.
func TestIdempotencyInFlightNeverEvicted(t *testing.T) {
	t.Parallel()
	im := newIdempotency(time.Minute, 2, 1<<20, 1<<20, time.Now)
	im.maxTotal = 3
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan struct{}, 3)
	runs := make(chan string, 10)
	block := func(key string) func() (any, *apiError) {
		return func() (any, *apiError) {
			runs <- key
			started <- struct{}{}
			<-release
			return json.RawMessage(`"` + key + `"`), nil
		}
	}
	type result struct {
		v any
		e *apiError
	}
	firsts := make(map[string]chan result)
	for _, tk := range []struct{ tid, key string }{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}} {
		ch := make(chan result, 1)
		firsts[tk.key] = ch
		go func() { v, e := im.do(ctx, tk.tid, tk.key, block(tk.key)); ch <- result{v, e} }()
		<-started
	}
	ran := false
	never := func() (any, *apiError) { ran = true; return json.RawMessage(`1`), nil }
	// the table is full of keys in flight: refused, honestly
	_, e := im.do(ctx, "c", "c1", never)
	if ran || e == nil || e.status != http.StatusTooManyRequests || strings.Contains(e.detail, "this session") || e.retryAfter <= 0 {
		t.Errorf("fresh session over a table of keys in flight: ran=%v err=%+v; want 429 with Retry-After, not blaming this session", ran, e)
	}
	// a's own cap: its keys are in flight, so its new one is refused
	_, e = im.do(ctx, "a", "a3", never)
	if ran || e == nil || e.status != http.StatusTooManyRequests || !strings.Contains(e.detail, "this session") {
		t.Errorf("session at its cap with keys in flight: ran=%v err=%+v; want 429 for this session", ran, e)
	}
	close(release)
	for key, ch := range firsts {
		if r := <-ch; r.e != nil || string(r.v.(json.RawMessage)) != `"`+key+`"` {
			t.Errorf("%s: first call %v %v", key, r.v, r.e)
		}
	}
	// every first call is still remembered: its repeat is answered, not run
	for key, tid := range map[string]string{"a1": "a", "a2": "a", "b1": "b"} {
		if v, e := im.do(ctx, tid, key, never); ran || e != nil || string(v.(json.RawMessage)) != `"`+key+`"` {
			t.Errorf("repeat of %s: ran=%v %v %v; want the first answer", key, ran, v, e)
		}
	}
	if n := len(runs); n != 3 {
		t.Errorf("%d runs, want 3 (one per key)", n)
	}
}

// The heaviest session's keys in flight stay; room comes from the heaviest
// session with a finished key.
func TestIdempotencyEvictsFinishedNotHeaviestInFlight(t *testing.T) {
	t.Parallel()
	im := newIdempotency(time.Minute, 10, 1<<20, 1<<20, time.Now)
	im.maxTotal = 5
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan struct{})
	done := make(chan *apiError, 3)
	for _, key := range []string{"h1", "h2", "h3"} {
		go func() {
			_, e := im.do(ctx, "heavy", key, func() (any, *apiError) { started <- struct{}{}; <-release; return json.RawMessage(`1`), nil })
			done <- e
		}()
		<-started
	}
	for _, key := range []string{"l1", "l2"} {
		if _, e := im.do(ctx, "light", key, func() (any, *apiError) { return json.RawMessage(`1`), nil }); e != nil {
			t.Fatal(e)
		}
	}
	if _, e := im.do(ctx, "fresh", "f1", func() (any, *apiError) { return json.RawMessage(`1`), nil }); e != nil {
		t.Fatalf("fresh session refused: %v", e)
	}
	if n := len(im.m["heavy"].keys); n != 3 {
		t.Errorf("heavy keeps %d keys, want its 3 in flight", n)
	}
	if n := len(im.m["light"].keys); n != 1 {
		t.Errorf("light keeps %d keys, want 1 (its oldest finished gave room)", n)
	}
	close(release)
	for range 3 {
		if e := <-done; e != nil {
			t.Error(e)
		}
	}
}

// BenchmarkIdempotencyFullTable: a keyed call from a fresh session while
// the table is full (50 sessions × 1,000 finished keys), each making room by
// evicting the heaviest session's oldest key.
//
//	go test -run XXX -bench IdempotencyFullTable -benchtime 20000x ./lap
func BenchmarkIdempotencyFullTable(b *testing.B) {
	im := newIdempotency(time.Minute, 1000, 1<<30, 1<<30, time.Now)
	ctx := context.Background()
	ok := func() (any, *apiError) { return json.RawMessage(`1`), nil }
	for i := range MaxIdempotencyEntries {
		im.do(ctx, fmt.Sprint("a", i/1000), fmt.Sprint("k", i), ok)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, e := im.do(ctx, fmt.Sprint("h", i%100), fmt.Sprint("n", i), ok); e != nil {
			b.Fatal(e)
		}
	}
}
