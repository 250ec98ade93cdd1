package lapdtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// GiveUp is how long lapd.js keeps reconnecting a lost session before it
// gives up.
const GiveUp = 5 * time.Minute

// Backoff is lapd.js's delay before reconnect attempt n (0-based): 1, 2, 4,
// 8, 16, then 30 s.
func Backoff(attempt int) time.Duration {
	if attempt < 0 {
		attempt = 0
	}
	if attempt >= 5 {
		return 30 * time.Second
	}
	return time.Second << attempt
}

// EndedError is why Keep stopped reconnecting: the session is over and a
// new mint is needed (lapd.js shows the same codes in its panel).
type EndedError struct {
	Code   string // revoked, superseded, version, auth-failed, forbidden, gave-up
	Detail string
}

func (e *EndedError) Error() string { return "lapdtest: session ended: " + e.Code + ": " + e.Detail }

// Keep pairs a tab with the session and keeps it paired the way lapd.js
// does, until ctx ends (Keep then closes the tab and returns nil) or the
// session ends (an *EndedError):
//
//   - the server closed with 1012 (restarting), 4408 (heartbeat), 4008
//     (too slow) or the connection dropped: reconnect after Backoff(attempt),
//     attempt 0 after every successful pairing; the tab keeps its state
//     and, through lapd's confirm-sync, its pending approvals;
//   - a refused dial: 401 or 403 ends the session, anything else (the
//     server is down, 503 shutting-down) is retried the same way;
//   - 4001 revoked, 4002 superseded, 4426 version: the session is over;
//   - after GiveUp of failed attempts: gave-up.
//
// onTab (may be nil) is called with each newly paired tab, on Keep's
// goroutine; it must not block (watch tab.Done() on your own goroutine).
// opts configure every tab, as for Dial.
func Keep(ctx context.Context, wsURL, token string, onTab func(*Tab), opts ...Option) error {
	var elapsed time.Duration
	attempt := 0
	var state any
	carried := false
	for {
		dopts := opts
		if carried {
			dopts = append(append([]Option(nil), opts...), WithState(state))
		}
		tab, err := Dial(ctx, wsURL, token, dopts...)
		switch {
		case err == nil:
			attempt, elapsed = 0, 0
			if onTab != nil {
				onTab(tab)
			}
			select {
			case <-ctx.Done():
				tab.Close()
				return nil
			case <-tab.Done():
			}
			tab.Abort() // wait for its handlers
			state, carried = tab.State(), true
			switch code := tab.CloseStatus(); code {
			case 4001:
				return &EndedError{Code: "revoked", Detail: "the session was revoked"}
			case 4002:
				return &EndedError{Code: "superseded", Detail: "another connection took over this session"}
			case 4426:
				return &EndedError{Code: "version", Detail: "this client is too old for the server"}
			}
		case ctx.Err() != nil:
			return nil
		default:
			var de *DialError
			if errors.As(err, &de) {
				switch de.Status {
				case http.StatusUnauthorized:
					return &EndedError{Code: "auth-failed", Detail: fmt.Sprintf("the token is no longer valid (%s)", de.Body)}
				case http.StatusForbidden:
					return &EndedError{Code: "forbidden", Detail: fmt.Sprintf("refused: %s", de.Body)}
				}
			}
		}
		delay := Backoff(attempt)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		elapsed += delay
		if elapsed >= GiveUp {
			return &EndedError{Code: "gave-up", Detail: "gave up reconnecting after 5 minutes"}
		}
		attempt++
	}
}
