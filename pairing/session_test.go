package pairing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/tokens"
)

func TestHelloAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.PingInterval = 20 * time.Second })
	tok, tid := e.mint("")
	tb := e.dial(tok, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "demo", "appVersion": "1.2", "schemaHash": "abc", "lapVersion": 2,
		"msgSchema": map[string]any{"discriminant": "type"}, "visible": true, "policy": map[string]any{"variants": map[string]any{}}})
	ack := tb.expect("hello-ack")
	if ack["lapVersion"] != 2.0 || ack["minClientVersion"] != 2.0 || ack["heartbeatMs"] != 20000.0 {
		t.Fatalf("hello-ack %v", ack)
	}
	if got := recv(t, e.paired); got != tid {
		t.Fatalf("OnPaired(%q)", got)
	}
	h, ok := e.reg.Hello(tid)
	if !ok || h.AppName != "demo" || h.AppVersion != "1.2" || h.SchemaHash != "abc" || h.LapVersion != 2 ||
		string(h.MsgSchema) != `{"discriminant":"type"}` || string(h.Policy) != `{"variants":{}}` {
		t.Fatalf("Hello = %+v, %v", h, ok)
	}
	hl := e.reg.Health(tid)
	if !hl.Connected || hl.Visible == nil || !*hl.Visible || hl.ConnectedAt == 0 || hl.Reconnects != 0 {
		t.Fatalf("Health = %+v", hl)
	}
	// A second hello is acked again but OnPaired runs once per socket.
	tb.send(map[string]any{"t": "hello", "appName": "demo2", "schemaHash": "x"})
	tb.expect("hello-ack")
	tb.send(map[string]any{"t": "visibility", "visible": false})
	tb.send(map[string]any{"t": "ping"})
	pong := tb.expect("pong")
	if _, ok := pong["at"].(float64); !ok {
		t.Fatalf("pong %v", pong)
	}
	if h, _ := e.reg.Hello(tid); h.AppName != "demo2" {
		t.Fatalf("hello not replaced: %+v", h)
	}
	if hl := e.reg.Health(tid); hl.Visible == nil || *hl.Visible {
		t.Fatalf("visibility not recorded: %+v", hl)
	}
	select {
	case p := <-e.paired:
		t.Fatalf("OnPaired again: %q", p)
	default:
	}
	if a := e.sink.find(audit.EventClaim); len(a) != 1 || a[0].TID != tid || a[0].Detail["transport"] != "ws" || a[0].Detail["repair"] != false {
		t.Fatalf("claim audit %+v", a)
	}
}

func TestVersionSkew(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.dial(tok, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "old", "schemaHash": "h", "lapVersion": 1})
	// As the reference: hello-ack (which names the minimum client version)
	// comes first, then the close.
	if ack := tb.expect("hello-ack"); ack["minClientVersion"] != float64(MinClientVersion) {
		t.Fatalf("hello-ack %v", ack)
	}
	if got := tb.closeStatus(); got != CloseVersionSkew {
		t.Fatalf("close %d, want %d", got, CloseVersionSkew)
	}
	recv(t, e.closed)
	if _, ok := e.reg.Hello(tid); ok || e.reg.IsPaired(tid) {
		t.Fatal("skewed tab still registered")
	}
}

func TestRepairCallsOnPairedWithRepair(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	e.pair(tok).ws.Close(websocket.StatusGoingAway, "reload")
	recv(t, e.closed)
	rec, _ := e.tm.Get(context.Background(), tid)
	if rec.Status != tokens.StatusPendingResume {
		t.Fatalf("status after close %s", rec.Status)
	}
	tb := e.dial(tok, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "demo", "schemaHash": "h"})
	tb.expect("hello-ack")
	if got := recv(t, e.paired); got != tid+" repair" {
		t.Fatalf("OnPaired %q", got)
	}
	if h := e.reg.Health(tid); h.Reconnects != 1 || !h.Connected {
		t.Fatalf("Health %+v", h)
	}
	if d := e.sink.find(audit.EventDisconnect); len(d) != 1 || d[0].Detail["reason"] != "client-closed 1001" {
		t.Fatalf("disconnect audit %+v", d)
	}
}

// answer reads one rpc frame and replies with fn's frame.
func (tb *tab) answer(fn func(id string, f map[string]any) map[string]any) {
	tb.t.Helper()
	f := tb.expect("rpc")
	tb.send(fn(f["id"].(string), f))
}

func TestCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.pair(tok)
	ctx := context.Background()

	t.Run("reply", func(t *testing.T) {
		done := make(chan error, 1)
		var res json.RawMessage
		go func() {
			var err error
			res, err = e.reg.Call(ctx, tid, "get_state", map[string]any{"path": "/a"}, 0)
			done <- err
		}()
		f := tb.expect("rpc")
		if f["tool"] != "get_state" || f["args"].(map[string]any)["path"] != "/a" || len(f["id"].(string)) != 36 {
			t.Fatalf("rpc frame %v", f)
		}
		tb.send([]byte(`{"t":"rpc-reply","id":"` + f["id"].(string) + `","result":{"state":{"a":[1, 2]}}}`))
		if err := recv(t, done); err != nil {
			t.Fatal(err)
		}
		if string(res) != `{"state":{"a":[1, 2]}}` {
			t.Fatalf("result %s (must pass through byte for byte)", res)
		}
	})
	t.Run("raw args", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := e.reg.Call(ctx, tid, "observe", json.RawMessage(`{"x":1}`), 0); done <- err }()
		tb.answer(func(id string, f map[string]any) map[string]any {
			if f["args"].(map[string]any)["x"] != 1.0 {
				t.Errorf("args %v", f["args"])
			}
			return map[string]any{"t": "rpc-reply", "id": id, "result": nil}
		})
		if err := recv(t, done); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("rpc-error", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := e.reg.Call(ctx, tid, "nope", nil, 0); done <- err }()
		tb.answer(func(id string, _ map[string]any) map[string]any {
			return map[string]any{"t": "rpc-error", "id": id, "code": "invalid", "detail": "unknown tool: nope"}
		})
		var re *RPCError
		if err := recv(t, done); !errors.As(err, &re) || re.Code != "invalid" || re.Detail != "unknown tool: nope" || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err %v (the tab's answer is not in doubt)", err)
		}
	})
	t.Run("timeout, then the late reply is counted", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := e.reg.Call(ctx, tid, "slow", nil, 30*time.Millisecond); done <- err }()
		f := tb.expect("rpc")
		if err := recv(t, done); !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err %v, want ErrTimeout and ErrOutcomeUnknown", err)
		}
		before := e.reg.Stats().UnknownReplies
		tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": 1})
		tb.send(map[string]any{"t": "ping"})
		tb.expect("pong")
		if got := e.reg.Stats().UnknownReplies; got != before+1 {
			t.Fatalf("UnknownReplies %d → %d", before, got)
		}
	})
	t.Run("ctx canceled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { _, err := e.reg.Call(cctx, tid, "slow", nil, 0); done <- err }()
		tb.expect("rpc")
		cancel()
		if err := recv(t, done); !errors.Is(err, context.Canceled) || !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("unknown tid", func(t *testing.T) {
		if _, err := e.reg.Call(ctx, "nobody", "x", nil, 0); !errors.Is(err, ErrPaused) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err %v (never sent: not in doubt)", err)
		}
		if err := e.reg.Push("nobody", map[string]any{"t": "active"}); !errors.Is(err, ErrPaused) {
			t.Fatalf("Push err %v", err)
		}
	})
	t.Run("paused when the tab goes", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := e.reg.Call(ctx, tid, "x", nil, 0); done <- err }()
		tb.expect("rpc")
		tb.ws.Close(websocket.StatusGoingAway, "")
		if err := recv(t, done); !errors.Is(err, ErrPaused) || !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("err %v, want ErrPaused and ErrOutcomeUnknown", err)
		}
		recv(t, e.closed)
		if e.reg.IsPaired(tid) {
			t.Fatal("still paired")
		}
		if _, err := e.reg.Call(ctx, tid, "x", nil, 0); !errors.Is(err, ErrPaused) {
			t.Fatalf("after close: %v", err)
		}
	})
}

// TestCallExactlyOnce races replies against the socket's close: every Call
// returns exactly one outcome and none hangs.
func TestCallExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for round := range 5 {
		tok, tid := e.mint("")
		tb := e.pair(tok)
		const n = 20
		var wg sync.WaitGroup
		results := make(chan error, n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := e.reg.Call(context.Background(), tid, "x", nil, 5*time.Second)
				results <- err
			}()
		}
		for i := range n {
			f := tb.expect("rpc")
			tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": i})
			if i == n/2 {
				go tb.ws.Close(websocket.StatusGoingAway, "") // races the remaining replies
			}
			if i >= n/2 {
				break
			}
		}
		wg.Wait()
		close(results)
		ok, paused := 0, 0
		for err := range results {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, ErrPaused):
				paused++
			default:
				t.Fatalf("round %d: unexpected %v", round, err)
			}
		}
		if ok+paused != n || ok < n/2 {
			t.Fatalf("round %d: ok=%d paused=%d", round, ok, paused)
		}
		recv(t, e.closed)
	}
}

func TestSupersedeMigratesCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	a := e.pair(tok)
	done := make(chan error, 1)
	var res json.RawMessage
	go func() {
		var err error
		res, err = e.reg.Call(context.Background(), tid, "get_state", nil, 0)
		done <- err
	}()
	id := a.expect("rpc")["id"]
	watchDone := make(chan error, 1)
	go func() { _, err := e.reg.Watch(context.Background(), tid, "/x"); watchDone <- err }()
	wid := a.expect("watch")["id"]

	b := e.pair(tok) // newest wins
	if got := a.closeStatus(); got != CloseSuperseded {
		t.Fatalf("old socket closed with %d, want %d", got, CloseSuperseded)
	}
	// The call sent on A is answered on B.
	b.send(map[string]any{"t": "rpc-reply", "id": id, "result": "from-b"})
	if err := recv(t, done); err != nil || string(res) != `"from-b"` {
		t.Fatalf("migrated call: %s, %v", res, err)
	}
	b.send(map[string]any{"t": "state-update", "id": wid, "path": "/x", "stateAfter": 3})
	if err := recv(t, watchDone); err != nil {
		t.Fatalf("migrated watch: %v", err)
	}
	b.expect("unwatch")
	// A's (late) close changed nothing.
	if !e.reg.IsPaired(tid) {
		t.Fatal("superseded socket's close unpaired the tab")
	}
	select {
	case c := <-e.closed:
		t.Fatalf("OnClosed(%q) for a superseded socket", c)
	default:
	}
	if s := e.reg.Stats(); s.Superseded != 1 || s.ActiveTabs != 1 {
		t.Fatalf("stats %+v", s)
	}
	if h := e.reg.Health(tid); h.Reconnects != 1 {
		t.Fatalf("Health %+v", h)
	}
	b.send(map[string]any{"t": "ping"})
	b.expect("pong")
}

func TestHeartbeatClosesDeadTab(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.PingInterval = 300 * time.Millisecond })
	tok, tid := e.mint("")
	live := e.pair(tok) // answers pings: it has a reader
	tok2, tid2 := e.mint("")
	ws, _, err := e.dialRaw(tok2, dialOpts{})
	if err != nil {
		t.Fatal(err)
	}
	dead := e.wrap(ws, dialOpts{noReader: true})
	if err := dead.ws.Write(ctxT(t), websocket.MessageText, []byte(`{"t":"hello","appName":"x","schemaHash":"h"}`)); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, e.closed); got != tid2 {
		t.Fatalf("closed %q, want the dead tab %q", got, tid2)
	}
	rec, _ := e.tm.Get(context.Background(), tid2)
	if rec.Status != tokens.StatusPendingResume {
		t.Fatalf("dead tab's record is %s", rec.Status)
	}
	if s := e.reg.Stats(); s.HeartbeatCloses != 1 {
		t.Fatalf("stats %+v", s)
	}
	if d := e.sink.find(audit.EventDisconnect); len(d) != 1 || d[0].Detail["reason"] != "heartbeat-missed" {
		t.Fatalf("disconnect audit %+v", d)
	}
	if h := e.reg.Health(tid); !h.Connected || h.LastHeartbeat == 0 {
		t.Fatalf("live tab %+v", h)
	}
	_ = live
}

// A hidden page's timers run about once a minute, and lapd.js's heartbeats
// with them: a tab that said it is hidden is not closed for the silence
// that closes a visible one (two intervals and a half), only after
// HiddenBeat's two and a half minutes. Both tabs here beat once, then go
// silent; the hidden one's silence began first.
func TestHeartbeatSparesHiddenTab(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.PingInterval = 300 * time.Millisecond })
	beatOnce := func(visible bool) (*tab, string) {
		tok, tid := e.mint("")
		tb := e.dial(tok, dialOpts{})
		tb.send(map[string]any{"t": "hello", "appName": "x", "schemaHash": "h", "visible": visible})
		tb.expect("hello-ack")
		recv(t, e.paired)
		tb.send(map[string]any{"t": "ping"}) // its own heartbeats, as lapd.js: no WebSocket pings
		tb.expect("pong")
		return tb, tid
	}
	hidden, hiddenTID := beatOnce(false)
	_, visibleTID := beatOnce(true)
	if got := recv(t, e.closed); got != visibleTID {
		t.Fatalf("closed %q first, want the visible silent tab %q (the hidden one is %q)", got, visibleTID, hiddenTID)
	}
	hidden.send(map[string]any{"t": "ping"})
	hidden.expect("pong")
	if h := e.reg.Health(hiddenTID); !h.Connected {
		t.Fatalf("hidden tab %+v, want still connected", h)
	}
	// Shown again, it is held to the interval once more.
	hidden.send(map[string]any{"t": "visibility", "visible": true})
	if got := recv(t, e.closed); got != hiddenTID {
		t.Fatalf("closed %q, want the tab shown again and silent %q", got, hiddenTID)
	}
}

func TestQueueOverflow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.SendQueue = 4 })
	tok, tid := e.mint("")
	tb := e.dial(tok, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "x", "schemaHash": "h"})
	tb.expect("hello-ack")
	recv(t, e.paired)
	big := json.RawMessage(`{"t":"log-push","entry":"` + strings.Repeat("x", 1<<20) + `"}`)
	// The tab's reader is slow: pushes outrun the socket. Push never blocks;
	// eventually the queue is full and the tab is closed.
	var err error
	for i := 0; i < 10000 && err == nil; i++ {
		err = e.reg.Push(tid, big)
	}
	if !errors.Is(err, ErrPaused) {
		t.Fatalf("Push never overflowed: %v", err)
	}
	if got := tb.closeStatus(); got != CloseQueueOverflow {
		t.Fatalf("close %d, want %d", got, CloseQueueOverflow)
	}
	recv(t, e.closed)
	if s := e.reg.Stats(); s.QueueOverflowCloses != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestLogRing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.LogRing = 3 })
	tok, tid := e.mint("")
	tb := e.pair(tok)
	kinds := []string{"read", "dispatched", "read", "blocked", "read"}
	for i, k := range kinds {
		tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": fmt.Sprint(i), "kind": k}})
		recv(t, e.logs)
	}
	ids := func(es []json.RawMessage) string {
		var out []string
		for _, e := range es {
			var m struct{ ID string }
			json.Unmarshal(e, &m)
			out = append(out, m.ID)
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		n    int
		kind string
		want string
	}{{10, "", "4,3,2"}, {2, "", "4,3"}, {0, "", "4,3,2"}, {10, "read", "4,2"}, {1, "read", "4"}, {10, "blocked", "3"}, {10, "dispatched", ""}}
	for _, tc := range tests {
		if got := ids(e.reg.RecentLog(tid, tc.n, tc.kind)); got != tc.want {
			t.Errorf("RecentLog(%d, %q) = %s, want %s", tc.n, tc.kind, got, tc.want)
		}
	}
	// An entry the server made goes in the same ring, without the hook.
	if err := e.reg.AppendLog(tid, json.RawMessage(`{"id":"s","kind":"blocked"}`)); err != nil {
		t.Fatal(err)
	}
	if got := ids(e.reg.RecentLog(tid, 10, "blocked")); got != "s,3" {
		t.Fatalf("after AppendLog: %s", got)
	}
	select {
	case <-e.logs:
		t.Fatal("AppendLog called OnLogAppend")
	default:
	}
	if err := e.reg.AppendLog("no-such-tid", json.RawMessage(`{}`)); !errors.Is(err, ErrPaused) {
		t.Fatalf("AppendLog for an unknown tid: %v", err)
	}
	// Kept after close (Retention), dropped by Unregister.
	tb.ws.Close(websocket.StatusNormalClosure, "")
	recv(t, e.closed)
	if got := ids(e.reg.RecentLog(tid, 10, "")); got != "s,4,3" {
		t.Fatalf("after close: %s", got)
	}
	e.reg.Unregister(tid)
	if got := e.reg.RecentLog(tid, 10, ""); len(got) != 0 {
		t.Fatalf("after Unregister: %s", got)
	}
	if err := e.reg.AppendLog(tid, json.RawMessage(`{}`)); !errors.Is(err, ErrPaused) {
		t.Fatalf("AppendLog after Unregister: %v", err)
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.pair(tok)
	t.Run("changed", func(t *testing.T) {
		done := make(chan json.RawMessage, 1)
		go func() {
			st, err := e.reg.Watch(context.Background(), tid, "/todos")
			if err != nil {
				t.Error(err)
			}
			done <- st
		}()
		w := tb.expect("watch")
		if w["path"] != "/todos" {
			t.Fatalf("watch %v", w)
		}
		tb.send(map[string]any{"t": "state-update", "id": "someone-else", "path": "/", "stateAfter": 0})
		tb.send(map[string]any{"t": "state-update", "id": w["id"], "path": "/todos", "stateAfter": []int{1}})
		if st := recv(t, done); string(st) != "[1]" {
			t.Fatalf("stateAfter %s", st)
		}
		if u := tb.expect("unwatch"); u["id"] != w["id"] {
			t.Fatalf("unwatch %v", u)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := e.reg.Watch(ctx, tid, ""); done <- err }()
		w := tb.expect("watch")
		if _, has := w["path"]; has {
			t.Fatalf("empty path sent: %v", w)
		}
		if err := recv(t, done); !errors.Is(err, ErrTimeout) {
			t.Fatalf("err %v", err)
		}
		if u := tb.expect("unwatch"); u["id"] != w["id"] {
			t.Fatalf("unwatch %v", u)
		}
	})
	t.Run("paused", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := e.reg.Watch(context.Background(), tid, "/a"); done <- err }()
		tb.expect("watch")
		tb.ws.Close(websocket.StatusGoingAway, "")
		if err := recv(t, done); !errors.Is(err, ErrPaused) {
			t.Fatalf("err %v", err)
		}
	})
}

func TestMalformedFramesAreCountedAndSurvived(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, _ := e.mint("")
	tb := e.pair(tok)
	bad := []string{`not json`, `[]`, `{}`, `{"t":5}`, `{"t":"rpc-reply"}`, `{"t":"rpc-error","id":"x"}`,
		`{"t":"log-append","entry":"str"}`, `{"t":"visibility"}`, `{"t":"confirm-resolved","confirmId":"c","outcome":"maybe"}`, `{"t":"hello","appName":7}`}
	for _, b := range bad {
		tb.send([]byte(b))
	}
	tb.send([]byte(`{"t":"what-is-this"}`))
	tb.send(map[string]any{"t": "confirm-resolved", "confirmId": "c1", "outcome": "confirmed", "stateAfter": map[string]any{"n": 1}})
	tb.send(map[string]any{"t": "ping"})
	tb.expect("pong")
	if r := recv(t, e.confs); r.ConfirmID != "c1" || r.Outcome != "confirmed" || string(r.StateAfter) != `{"n":1}` {
		t.Fatalf("confirm-resolved %+v", r)
	}
	if s := e.reg.Stats(); s.Malformed != int64(len(bad)) || s.Unknown != 1 {
		t.Fatalf("stats %+v, want %d malformed and 1 unknown", s, len(bad))
	}
}

func TestFrameTooBig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.pair(tok)
	huge := []byte(`{"t":"log-append","entry":{"x":"` + strings.Repeat("a", DefaultMaxFrame) + `"}}`)
	_ = tb.ws.Write(ctxT(t), websocket.MessageText, huge) // may fail once the server closes
	if got := tb.closeStatus(); got != websocket.StatusMessageTooBig {
		t.Fatalf("close %d, want 1009", got)
	}
	if got := recv(t, e.closed); got != tid {
		t.Fatalf("closed %q", got)
	}
	if d := e.sink.find(audit.EventDisconnect); len(d) != 1 || d[0].Detail["reason"] != "frame-too-big" {
		t.Fatalf("disconnect audit %+v", d)
	}
}

func TestUnregister(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.pair(tok)
	done := make(chan error, 1)
	go func() { _, err := e.reg.Call(context.Background(), tid, "x", nil, 0); done <- err }()
	tb.expect("rpc")
	e.reg.Unregister(tid)
	if err := recv(t, done); !errors.Is(err, ErrPaused) {
		t.Fatalf("call: %v", err)
	}
	tb.expect("revoked")
	if got := tb.closeStatus(); got != CloseRevoked {
		t.Fatalf("close %d", got)
	}
	recv(t, e.closed)
	if _, ok := e.reg.Hello(tid); ok || e.reg.IsPaired(tid) {
		t.Fatal("buffers kept")
	}
	e.reg.Unregister(tid) // twice is fine
	e.reg.Unregister("never-seen")
}

func TestClosedBuffersBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.MaxClosed = 2 })
	var tids []string
	for range 3 {
		tok, tid := e.mint("")
		e.pair(tok).ws.Close(websocket.StatusNormalClosure, "")
		recv(t, e.closed)
		tids = append(tids, tid)
	}
	for i, tid := range tids {
		if _, ok := e.reg.Hello(tid); ok != (i > 0) {
			t.Errorf("tid %d hello kept = %v", i, ok)
		}
	}
}

func TestShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.pair(tok)
	tok2, _ := e.mint("")
	tb2 := e.pair(tok2)
	done := make(chan error, 1)
	go func() { _, err := e.reg.Call(context.Background(), tid, "x", nil, 0); done <- err }()
	tb.expect("rpc")
	if err := e.reg.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, done); !errors.Is(err, ErrClosed) {
		t.Fatalf("in-flight call: %v", err)
	}
	for _, x := range []*tab{tb, tb2} {
		if got := x.closeStatus(); got != CloseRestart {
			t.Fatalf("close %d, want 1012", got)
		}
	}
	_, resp, err := e.dialRaw(tok, dialOpts{})
	if err == nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("dial after Shutdown: %v %v", resp, err)
	}
	if _, err := e.reg.Call(context.Background(), tid, "x", nil, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Call after Shutdown: %v", err)
	}
	rec, _ := e.tm.Get(context.Background(), tid)
	if rec.Status != tokens.StatusPendingResume {
		t.Fatalf("record after shutdown %s (the tab should be able to resume)", rec.Status)
	}
}

func TestClosedBuffersExpire(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.Retention = time.Nanosecond })
	tok1, tid1 := e.mint("")
	tok2, tid2 := e.mint("")
	a, b := e.pair(tok1), e.pair(tok2)
	a.ws.Close(websocket.StatusNormalClosure, "")
	recv(t, e.closed)
	b.ws.Close(websocket.StatusNormalClosure, "") // closing sweeps expired buffers
	recv(t, e.closed)
	if _, ok := e.reg.Hello(tid1); ok {
		t.Fatalf("%s's buffers outlived Retention", tid1)
	}
	_ = tid2
}

// TestWriteTimeoutClosesStuckTab: a tab that stops reading blocks its
// writer; once a frame has taken longer than WriteTimeout the socket is
// closed, and counted.
func TestWriteTimeoutClosesStuckTab(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) {
		c.PingInterval = 3 * time.Second // ticks every second; heartbeats are no concern here
		c.WriteTimeout = 300 * time.Millisecond
		c.SendQueue = 1000
	})
	tok, tid := e.mint("")
	tb := e.dial(tok, dialOpts{noReader: true}) // never reads
	tb.send(map[string]any{"t": "hello", "appName": "x", "schemaHash": "h"})
	recv(t, e.paired)
	big := json.RawMessage(`{"t":"log-push","entry":"` + strings.Repeat("x", 1<<20) + `"}`)
	for range 64 { // far more than the socket buffers hold
		if err := e.reg.Push(tid, big); err != nil {
			t.Fatalf("Push: %v", err)
		}
	}
	if got := recv(t, e.closed); got != tid {
		t.Fatalf("closed %q, want %q", got, tid)
	}
	if s := e.reg.Stats(); s.WriteTimeouts != 1 || s.QueueOverflowCloses != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A PingInterval of 1ns made the registry's loop call time.NewTicker(0),
// which panicked at the first tab (lapd serve --heartbeat 1ns crashed).
// It is raised to MinPingInterval.
func TestTinyPingIntervalIsRaised(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.PingInterval = time.Nanosecond })
	tok, tid := e.mint("")
	tb := e.dial(tok, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "demo", "lapVersion": 2})
	ack := tb.expect("hello-ack")
	if ack["heartbeatMs"] != float64(MinPingInterval.Milliseconds()) {
		t.Fatalf("hello-ack heartbeatMs %v, want %d", ack["heartbeatMs"], MinPingInterval.Milliseconds())
	}
	if got := recv(t, e.paired); got != tid {
		t.Fatalf("OnPaired(%q)", got)
	}
}
