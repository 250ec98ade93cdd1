package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lapdtest"
)

// TestMCPPausedThenRecovered: the tab goes away, a tool call meets 503
// paused (reconnect=pending, Retry-After inside the grace window), the tab
// re-pairs with the same token, and the executor's retry succeeds.
func TestMCPPausedThenRecovered(t *testing.T) {
	t.Parallel()
	for _, tr := range mcpTransports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			// Own server: /healthz counts every tab. A short grace keeps
			// Retry-After (the grace left) short.
			s := startServer(t, "", append([]string{"--lap-rate", mcpNoRateLimit, "--grace", "4s"}, mcpAllTools...)...)
			tab, m := mcpTab(t, s, lapdtest.WithState(map[string]any{"count": 7.0, "todos": []any{}}))
			c := tr.dial(t, s)
			h, _ := mcpConnect(t, c, m)
			if err := tab.Close(); err != nil {
				t.Fatalf("closing the tab: %v", err)
			}
			mcpEventually(t, "the server to see the tab gone", func() bool { return s.mcpTabs(t) == 0 })

			done := make(chan mcpOut, 1)
			go func() {
				o, err := mcpTryCall(ctxT(t, 40*time.Second), c, "get_state", map[string]any{"session": h, "path": "/count"})
				if err != nil {
					o = mcpOut{IsError: true, Text: "protocol error: " + err.Error()}
				}
				done <- o
			}()
			// The call met 503 paused (lapd audits every refusal) ...
			mcpEventually(t, "a paused refusal for this tid", func() bool { return mcpAudited(s, "refused", m.TID, "paused") })
			select {
			case o := <-done:
				t.Fatalf("the call returned before the tab came back: %s", o.Text)
			default:
			}
			// ... and the tab comes back within the grace window.
			tab2 := mcpDial(t, m, lapdtest.WithState(map[string]any{"count": 8.0, "todos": []any{}}))
			o := <-done
			if o.IsError || o.SC["state"] != 8.0 {
				t.Fatalf("get_state after the tab came back: %s", o.Text)
			}
			if tab2.RPCCount("get_state") != 1 {
				t.Fatalf("the re-paired tab answered %d get_state rpcs", tab2.RPCCount("get_state"))
			}
		})
	}
}

// mcpAudited reports whether the server's stdout audit has an entry of event
// for tid whose detail mentions code.
func mcpAudited(s *server, event, tid, code string) bool {
	for _, line := range strings.Split(s.audit.String(), "\n") {
		var e struct {
			Event  string
			TID    string
			Detail map[string]any
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Event != event || e.TID != tid {
			continue
		}
		if code == "" || strings.Contains(mcpJSON(e.Detail), `"`+code+`"`) {
			return true
		}
	}
	return false
}

// TestMCPRateLimited: with --lap-rate 3 the fourth LAP call of a token is
// refused 429; a call whose budget cannot wait out Retry-After returns
// rate-limited with retryAfterMs and how long to wait, and dispatches nothing.
func TestMCPRateLimited(t *testing.T) {
	t.Parallel()
	s := startServer(t, "", append([]string{"--lap-rate", "3"}, mcpAllTools...)...)
	for _, tr := range mcpTransports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			tab, m := mcpTab(t, s) // one token (and bucket) per transport
			c := tr.dial(t, s)
			h, _ := mcpConnect(t, c, m)                               // 1: /observe
			mcpOK(t, c, "get_state", map[string]any{"session": h})    // 2
			mcpOK(t, c, "list_actions", map[string]any{"session": h}) // 3
			// send_message waits out a rate limit only within timeoutMs + 2 s,
			// shorter than the ~20 s Retry-After.
			out := mcpCall(t, c, "send_message", map[string]any{"session": h, "msg": map[string]any{"type": "inc"}, "timeoutMs": 500})
			mcpWantError(t, out, "rate-limited", "wait", "before the next one")
			if ms, _ := mcpPath(out.SC, "error.retryAfterMs").(float64); ms < 1000 || ms > 20000 {
				t.Fatalf("retryAfterMs = %v: %s", ms, mcpJSON(out.SC))
			}
			if out.SC["idempotencyKey"] == nil {
				t.Fatalf("a refused send_message should return its idempotencyKey for the retry: %s", mcpJSON(out.SC))
			}
			if n := tab.RPCCount("send_message"); n != 0 {
				t.Fatalf("a rate-limited message reached the tab (%d rpcs)", n)
			}
			// the stdout sink may write after the response went out
			mcpEventually(t, "a rate-limited audit entry", func() bool { return mcpAudited(s, "rate-limited", m.TID, "") })
		})
	}
}

// TestMCPTwoSessions: two tabs (two apps, two tokens) bound in one MCP
// conversation; without `session` the error lists both, with it each works.
func TestMCPTwoSessions(t *testing.T) {
	t.Parallel()
	s := startServer(t, "", append([]string{"--lap-rate", mcpNoRateLimit}, mcpAllTools...)...)
	for _, tr := range mcpTransports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			tabA, mA := mcpTab(t, s, lapdtest.WithAppName("Alpha"))
			tabB, mB := mcpTab(t, s, lapdtest.WithAppName("Beta"), lapdtest.WithState(map[string]any{"count": 100.0, "todos": []any{}}))
			c := tr.dial(t, s)
			hA, outA := mcpConnect(t, c, mA)
			hB, outB := mcpConnect(t, c, mB)
			if hA == hB || outA.SC["appName"] != "Alpha" || outB.SC["appName"] != "Beta" {
				t.Fatalf("two connects: %s / %s", outA.Text, outB.Text)
			}
			out := mcpCall(t, c, "observe", nil)
			if tr.modern {
				// no MCP session, so no list to show: the handle is the capability
				mcpWantError(t, out, "session-required", "session handle")
			} else {
				mcpWantError(t, out, "session-required", hA+" (Alpha)", hB+" (Beta)")
				if ss, _ := out.SC["sessions"].([]any); len(ss) != 2 {
					t.Fatalf("sessions in the error: %s", mcpJSON(out.SC))
				}
			}
			if o := mcpOK(t, c, "get_state", map[string]any{"session": hA, "path": "/count"}); o.SC["state"] != 0.0 {
				t.Fatalf("Alpha get_state: %s", o.Text)
			}
			if o := mcpOK(t, c, "send_message", map[string]any{"session": hB, "msg": map[string]any{"type": "inc"}}); o.SC["status"] != "dispatched" {
				t.Fatalf("Beta send_message: %s", o.Text)
			}
			if mcpPath(tabB.State(), "count") != 101.0 || mcpPath(tabA.State(), "count") != 0.0 || tabA.RPCCount("send_message") != 0 {
				t.Fatalf("dispatch went to the wrong tab: A %v, B %v", tabA.State(), tabB.State())
			}
			if o := mcpOK(t, c, "observe", map[string]any{"session": hB}); o.SC["appName"] != "Beta" {
				t.Fatalf("Beta observe: %s", o.Text)
			}
			mcpWantError(t, mcpCall(t, c, "observe", map[string]any{"session": "s_aaaaaaaaaaaaaaaa"}), "unknown-session")
			// Dropping one leaves the other as the default (where defaults exist).
			mcpOK(t, c, "disconnect_session", map[string]any{"session": hA})
			if !tr.modern {
				if o := mcpOK(t, c, "observe", nil); o.SC["appName"] != "Beta" {
					t.Fatalf("observe after disconnecting Alpha: %s", o.Text)
				}
			}
		})
	}
}
