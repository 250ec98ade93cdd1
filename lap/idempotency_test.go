package lap

import (
	"context"
	"encoding/json"
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
