package pairing

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/tokens"
)

// TestFailedUpgradeChangesNothing: a request with a valid token whose
// upgrade fails after the token check (here Sec-WebSocket-Version: 12)
// leaves the live tab's session as it was. It used to move the record to
// pending-resume under the live socket, so after the grace its LAP calls
// read "expired".
func TestFailedUpgradeChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	tb := e.pair(tok)
	if _, _, err := e.tm.Activate(context.Background(), tid); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", strings.Replace(e.url(), "ws", "http", 1)+"?token="+tok, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "12")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatal("the bad upgrade succeeded")
	}
	rec, _ := e.tm.Get(context.Background(), tid)
	if rec.Status != tokens.StatusActive {
		t.Fatalf("after a failed upgrade the live session's record is %s, want active", rec.Status)
	}
	tb.send(map[string]any{"t": "ping"})
	tb.expect("pong")
	if !e.reg.IsPaired(tid) {
		t.Fatal("the live tab is gone")
	}
}

// TestReconnectRaceKeepsSessionLive: the old socket closes while the new
// one is between the token check and registration (a reload: the browser
// closes one and opens the other). The session must end up connected, not
// pending-resume under a live socket; and when that socket closes later,
// the record does move to pending-resume.
func TestReconnectRaceKeepsSessionLive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	tok, tid := e.mint("")
	old := e.pair(tok)
	if _, _, err := e.tm.Activate(context.Background(), tid); err != nil {
		t.Fatal(err)
	}
	e.reg.testHookConnect = func(string) {
		// The new socket is upgraded; the old one closes now.
		_ = old.ws.Close(websocket.StatusGoingAway, "reload")
		if got := recv(t, e.closed); got != tid {
			t.Errorf("closed %q", got)
		}
	}
	nw := e.pair(tok)
	rec, _ := e.tm.Get(context.Background(), tid)
	if rec.Status == tokens.StatusPendingResume || !e.reg.IsPaired(tid) {
		t.Fatalf("after the reconnect race the record is %s (paired %v), want a live session", rec.Status, e.reg.IsPaired(tid))
	}
	if rec.Status != tokens.StatusAwaitingClaude {
		t.Errorf("record %s, want awaiting-claude (the next LAP call activates it)", rec.Status)
	}
	// A normal close still starts the grace.
	e.reg.testHookConnect = nil
	_ = nw.ws.Close(websocket.StatusGoingAway, "bye")
	recv(t, e.closed)
	if rec, _ := e.tm.Get(context.Background(), tid); rec.Status != tokens.StatusPendingResume {
		t.Fatalf("after the new socket closed the record is %s, want pending-resume", rec.Status)
	}
}
