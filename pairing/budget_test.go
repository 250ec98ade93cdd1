package pairing

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/tokens"
)

func logBytes(es []json.RawMessage) (n int) {
	for _, e := range es {
		n += len(e)
	}
	return n
}

// The review: 20 tabs × 100 log entries × 255 KB = 680 MB kept in the log
// rings, closed tabs' too (here scaled down: 100 KB entries). Rings are now counted in bytes per tid
// (LogRingBytes), and with hellos in all (BufferBytes), shedding closed
// tabs' buffers first, then the heaviest tid's oldest entries.
func TestLogRingBytes(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 100<<10)
	t.Run("per tid", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		tok, tid := e.mint("")
		tb := e.pair(tok)
		for i := range 20 {
			tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": fmt.Sprint(i), "kind": "read", "detail": big}})
			recv(t, e.logs)
		}
		es := e.reg.RecentLog(tid, 0, "")
		if n := logBytes(es); n > DefaultLogRingBytes || len(es) == 0 {
			t.Fatalf("ring keeps %d entries, %d bytes; want at most %d bytes", len(es), n, DefaultLogRingBytes)
		}
		var newest struct{ ID string }
		_ = json.Unmarshal(es[0], &newest)
		if newest.ID != "19" {
			t.Fatalf("newest entry %q, want 19 (the oldest go first)", newest.ID)
		}
	})
	t.Run("in all, closed tabs included", func(t *testing.T) {
		t.Parallel()
		const budget = 1 << 20
		e := newEnv(t, func(c *Config, _ *tokens.Config) { c.BufferBytes = budget })
		var tids []string
		for range 10 {
			tok, tid := e.mint("")
			tids = append(tids, tid)
			tb := e.pair(tok)
			for i := range 5 {
				tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": fmt.Sprint(i), "kind": "read", "detail": big}})
				recv(t, e.logs)
			}
			tb.ws.Close(websocket.StatusNormalClosure, "")
			recv(t, e.closed)
		}
		total := 0
		for _, tid := range tids {
			total += logBytes(e.reg.RecentLog(tid, 0, ""))
		}
		st := e.reg.Stats()
		if total > budget || st.BufferBytes > budget || st.ClosedShed == 0 {
			t.Fatalf("kept %d log bytes, Stats %+v; want ≤ %d and closed tabs shed", total, st, budget)
		}
	})
}

// A hello that does not fit the budget even after shedding closes its
// socket with 1013 (try again later) instead of being kept.
func TestHelloOverBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.BufferBytes = 64 << 10 })
	tok, _ := e.mint("")
	tb := e.dial(tok, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "demo", "appVersion": "1", "schemaHash": "h", "lapVersion": 2,
		"docs": map[string]any{"text": strings.Repeat("d", 100<<10)}})
	if got := tb.closeStatus(); got != CloseOverloaded {
		t.Fatalf("close %d, want %d", got, CloseOverloaded)
	}
	if st := e.reg.Stats(); st.OverloadCloses != 1 || st.BufferBytes != 0 {
		t.Fatalf("Stats %+v", st)
	}
}

// Inbound frames over the socket's rate are delayed (the reader waits), not
// dropped.
func TestInboundRate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.FrameRate = 200; c.FrameBurst = 5 })
	tok, _ := e.mint("")
	tb := e.pair(tok)
	for i := range 30 {
		tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": fmt.Sprint(i)}})
	}
	for range 30 {
		recv(t, e.logs)
	}
	if st := e.reg.Stats(); st.Throttled == 0 {
		t.Fatalf("Stats %+v: no frame was delayed", st)
	}
}

// Answers to the server's own requests (rpc-reply, the log-append that
// echoes the rpc, as lapd.js sends both) are not counted in the socket's
// inbound rates: with a rate of 200 frames/s (burst 5) and 4 KiB/s (burst
// 2 KiB), 40 calls (80 frames, 25 KiB) answered as fast as the tab can are
// never delayed, while unsolicited frames past the bursts are.
func TestSolicitedFramesNotThrottled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) {
		c.FrameRate = 200
		c.FrameBurst = 5
		c.ByteRate = 4096
		c.MaxFrame = 1 << 10
	})
	tok, tid := e.mint("")
	tb := e.pair(tok) // hello: one unsolicited frame
	st0 := e.reg.Stats().Throttled
	for i := range 40 {
		done := make(chan error, 1)
		go func() {
			_, err := e.reg.Call(ctxT(t), tid, "observe", nil, 0)
			done <- err
		}()
		f := tb.expect("rpc")
		tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": map[string]any{"n": i, "pad": strings.Repeat("x", 600)}})
		tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": f["id"], "kind": "read"}})
		if err := recv(t, done); err != nil {
			t.Fatal(err)
		}
		recv(t, e.logs)
	}
	if st := e.reg.Stats(); st.Throttled != st0 {
		t.Fatalf("Stats %+v: %d answers were delayed", st, st.Throttled-st0)
	}
	// An rpc-reply nobody waits for is not an answer: it is counted.
	for range 4 {
		tb.send(map[string]any{"t": "rpc-reply", "id": "made-up", "result": strings.Repeat("x", 600)})
	}
	tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": "x"}})
	recv(t, e.logs)
	if st := e.reg.Stats(); st.Throttled == st0 {
		t.Fatalf("Stats %+v: unsolicited frames were not delayed", st)
	}
}

// The review (H5): 40 sockets holding distinct hellos of up to 4 MB filled
// the buffer budget, and every tab that came after, with an ordinary
// 262-byte hello, was closed with 1013 and could not pair. Scaled down: 8
// tabs' hellos of budget/8 bytes fill it exactly. A newcomer whose hello is
// smaller than theirs still pairs: the tab holding the largest hello is
// closed with 1013 (audited) to make room. The shed tab, reconnecting with
// its large hello, holds the largest one and is the one refused.
func TestHelloShedsHeaviest(t *testing.T) {
	t.Parallel()
	const budget = 1 << 20
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.BufferBytes = budget })
	bigHello := func(i int) map[string]any {
		// helloSize: appName + appVersion + schemaHash + helloOverhead, plus the docs' JSON.
		docs := fmt.Sprintf("%03d", i) + strings.Repeat("x", budget/8-(6+helloOverhead)-2-3)
		return map[string]any{"t": "hello", "appName": "evil", "appVersion": "1", "schemaHash": "h", "lapVersion": 2, "docs": docs}
	}
	heavy := map[string]*tab{}
	toks := map[string]string{}
	for i := range 8 {
		tok, tid := e.mint("")
		tb := e.dial(tok, dialOpts{})
		tb.send(bigHello(i))
		tb.expect("hello-ack")
		recv(t, e.paired)
		heavy[tid], toks[tid] = tb, tok
	}
	if st := e.reg.Stats(); st.BufferBytes != budget {
		t.Fatalf("Stats %+v: the big hellos keep %d bytes, want the whole budget %d", st, st.BufferBytes, budget)
	}

	tok, honest := e.mint("")
	e.pair(tok) // hello-ack: the honest tab pairs
	shed := recv(t, e.closed)
	tb, ok := heavy[shed]
	if !ok {
		t.Fatalf("closed %q, want one of the tabs holding a big hello", shed)
	}
	if got := tb.closeStatus(); got != CloseOverloaded {
		t.Fatalf("the shed tab was closed with %d, want %d", got, CloseOverloaded)
	}
	st := e.reg.Stats()
	if st.ActiveTabs != 8 || st.HellosShed != 1 || st.OverloadCloses != 1 || st.BufferBytes > budget {
		t.Fatalf("Stats %+v: want 7 big tabs and the honest one live, one shed", st)
	}
	var audited bool
	for _, a := range e.sink.find(audit.EventDisconnect) {
		if a.TID == shed && a.Detail["reason"] == "overloaded" {
			audited = true
		}
		if a.TID == honest {
			t.Fatalf("the honest tab's socket was closed: %+v", a)
		}
	}
	if !audited {
		t.Fatalf("no disconnect entry with reason overloaded for the shed tab %s", shed)
	}

	// The shed tab comes back with the same big hello: it is now the
	// largest (tied with the others), so it is refused, and nobody else is
	// shed for it.
	back := e.dial(toks[shed], dialOpts{})
	back.send(bigHello(99))
	if got := back.closeStatus(); got != CloseOverloaded {
		t.Fatalf("the reconnecting big hello was closed with %d, want %d", got, CloseOverloaded)
	}
	if st := e.reg.Stats(); st.HellosShed != 1 || st.OverloadCloses != 2 {
		t.Fatalf("Stats %+v: the reconnecting big hello shed another tab", st)
	}
}

// A hello over MaxHello closes its socket with 1009 and is not kept.
func TestHelloOverMaxHello(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.MaxHello = 10 << 10 })
	tok, _ := e.mint("")
	tb := e.dial(tok, dialOpts{})
	tb.send(map[string]any{"t": "hello", "appName": "demo", "appVersion": "1", "schemaHash": "h", "lapVersion": 2,
		"docs": strings.Repeat("d", 20<<10)})
	if got := tb.closeStatus(); got != websocket.StatusMessageTooBig {
		t.Fatalf("close %d, want %d", got, websocket.StatusMessageTooBig)
	}
	if st := e.reg.Stats(); st.HellosTooBig != 1 || st.BufferBytes != 0 {
		t.Fatalf("Stats %+v", st)
	}
	// A hello within it pairs.
	tok, _ = e.mint("")
	e.pair(tok)
}
