package pairing

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/tokens"
)

// waitParked polls Stats until n tabs are parked: the registry has no
// signal for "parked" besides its counters.
func waitParked(t *testing.T, e *env, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.reg.Stats().ParkedTabs != n {
		if time.Now().After(deadline) {
			t.Fatalf("parked tabs %d, want %d", e.reg.Stats().ParkedTabs, n)
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, not synchronisation
	}
}

// expectSkip is tab.expect, skipping pongs.
func expectSkip(tb *tab, typ string) map[string]any {
	tb.t.Helper()
	for {
		m := tb.next()
		if m["t"] != "pong" {
			if m["t"] != typ {
				tb.t.Fatalf("got frame %v, want t=%q", m, typ)
			}
			return m
		}
	}
}

// TestIdleTabParks: an idle tab's reader parks (Linux) after a tick without
// frames; it answers calls, pings and closes exactly as before, from either
// side, and Shutdown with parked tabs leaves no goroutine (goleak).
func TestIdleTabParks(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("idle tabs park on Linux only") // elsewhere each keeps its reader goroutine
	}
	t.Parallel()
	// Ticks every second; a tab silent for 7.5s is closed.
	e := newEnv(t, func(c *Config, _ *tokens.Config) { c.PingInterval = 3 * time.Second })
	tok, tid := e.mint("")
	tb := e.pair(tok)
	tb.send(map[string]any{"t": "ping"}) // a lapd.js tab: app heartbeats, no WebSocket pings
	tb.expect("pong")
	waitParked(t, e, 1)

	// A call wakes it up.
	done := make(chan error, 1)
	go func() {
		res, err := e.reg.Call(context.Background(), tid, "observe", nil, 0)
		if err == nil && string(res) != `{"ok":1}` {
			t.Errorf("result %s", res)
		}
		done <- err
	}()
	f := expectSkip(tb, "rpc")
	tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": map[string]any{"ok": 1}})
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	waitParked(t, e, 1) // and it parks again

	// The tab closes while parked: the registry sees it.
	tok2, tid2 := e.mint("")
	tb2 := e.pair(tok2)
	tb2.send(map[string]any{"t": "ping"})
	tb2.expect("pong")
	waitParked(t, e, 2)
	_ = tb2.ws.Close(websocket.StatusGoingAway, "bye")
	if got := recv(t, e.closed); got != tid2 {
		t.Fatalf("closed %q, want %q", got, tid2)
	}
	waitParked(t, e, 1)

	// lapd closes a parked tab (revoke): the close handshake completes.
	e.reg.Unregister(tid)
	if got := tb.closeStatus(); got != CloseRevoked {
		t.Fatalf("close %d, want %d", got, CloseRevoked)
	}
	if got := recv(t, e.closed); got != tid {
		t.Fatalf("closed %q, want %q", got, tid)
	}

	// Shutdown with a parked tab (TestMain's goleak checks the poller).
	tok3, _ := e.mint("")
	tb3 := e.pair(tok3)
	tb3.send(map[string]any{"t": "ping"})
	tb3.expect("pong")
	waitParked(t, e, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.reg.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tb3.closeStatus(); got != CloseRestart {
		t.Fatalf("close %d, want 1012", got)
	}
}
