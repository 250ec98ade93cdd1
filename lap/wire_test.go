package lap_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/tokens"
)

// detail is the error detail of r ("" when none).
func (r resp) detail() string {
	var m struct {
		Error struct {
			Detail string `json:"detail"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &m)
	return m.Error.Detail
}

// A tab reply whose status lapd does not know is 500 internal (the
// reference's "unknown browser status"), not passed through as 200.
func TestUnknownTabStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, tool, route string
		reply             any
		want              []string
	}{
		{"message weird", "send_message", "/message", map[string]any{"status": "weird"}, []string{"unknown browser status", `status "weird"`, "may have run", "observe"}},
		{"message string", "send_message", "/message", "str", []string{"unknown browser status", "not a JSON object", "observe"}},
		{"message no status", "send_message", "/message", map[string]any{"ok": true}, []string{"unknown browser status", "does not know"}},
		{"would-dispatch weird", "would_dispatch", "/would-dispatch", map[string]any{"status": "weird"}, []string{"unknown browser status", `status "weird"`}},
		{"would-dispatch string", "would_dispatch", "/would-dispatch", "str", []string{"unknown browser status", "not a JSON object"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			reply := tc.reply
			token, _, _ := e.paired(lapdtest.WithHandler(tc.tool, func(json.RawMessage) (any, *lapdtest.RPCError) { return reply, nil }))
			r := e.lapCall(token, tc.route, `{"msg":{"type":"inc"}}`)
			if r.status != 500 || r.code() != "internal" {
				t.Fatalf("%d %s, want 500 internal", r.status, r.body)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.detail(), w) {
					t.Errorf("detail %q lacks %q", r.detail(), w)
				}
			}
		})
	}
	// Known statuses still pass through; a proposal without a confirmId stays 500.
	e := newEnv(t)
	token, _, _ := e.paired(lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
		return map[string]any{"status": "pending-confirmation"}, nil
	}))
	if r := e.lapCall(token, "/message", `{"msg":{"type":"inc"}}`); r.status != 500 || !strings.Contains(r.detail(), "without a confirmId") {
		t.Errorf("pending-confirmation without confirmId: %d %s", r.status, r.body)
	}
	token2, _, _ := e.paired(lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
		return map[string]any{"status": "rejected", "reason": "invalid"}, nil
	}))
	if r := e.lapCall(token2, "/message", `{"msg":{"type":"inc"}}`); r.status != 200 || !strings.Contains(string(r.body), `"rejected"`) {
		t.Errorf("rejected: %d %s", r.status, r.body)
	}
	if r := e.lapCall(token2, "/would-dispatch", `{"msg":{"type":"inc"}}`); r.status != 200 || !strings.Contains(string(r.body), `"predicted"`) {
		t.Errorf("would-dispatch predicted: %d %s", r.status, r.body)
	}
}

// connectedWithoutHello dials a tab that never sends its hello and waits
// until lapd holds its socket.
func connectedWithoutHello(t *testing.T, e *env) (string, *lapdtest.Tab) {
	t.Helper()
	token, tid := e.mint()
	tab := e.dial(token, lapdtest.WithoutHello())
	deadline := time.Now().Add(10 * time.Second)
	for !e.reg.Health(tid).Connected {
		if time.Now().After(deadline) {
			t.Fatal("the tab's socket was never registered")
		}
		time.Sleep(time.Millisecond)
	}
	return token, tab
}

// /observe checks the hello before asking the tab (as the reference), and
// a tab that is connected without a hello is told so, not "not connected".
func TestObserveWithoutHello(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := connectedWithoutHello(t, e)
	for _, route := range []string{"/observe", "/describe"} {
		r := e.lapCall(token, route, "")
		if r.status != 503 || r.code() != "paused" || r.header.Get("Retry-After") != "1" ||
			!strings.Contains(r.detail(), "connected but has not introduced itself yet") || strings.Contains(r.detail(), "not connected") {
			t.Errorf("%s: %d %v %s", route, r.status, r.header, r.body)
		}
	}
	if n := tab.RPCCount("observe"); n != 0 {
		t.Errorf("observe reached a tab without a hello %d times", n)
	}
}

// An approval wait ends when the tab's socket closes (the reference's
// confirm waits resolve as timeout): /message answers pending-confirmation
// at once instead of waiting out approvalTimeoutMs, and the approval stays
// pending, re-delivered to the tab when it re-pairs.
func TestApprovalWaitEndsOnClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := confirmTab(e)
	done := make(chan resp, 1)
	go func() {
		done <- e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1000,"approvalTimeoutMs":120000}`)
	}()
	id := pendingID(t, tab)
	waitPending(t, e, id)
	tid := e.tids()[0]
	tab.Close()
	var r resp
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("/message still waits for the approval 60 s after the tab closed (approvalTimeoutMs 120000)")
	}
	if m := r.json(t); r.status != 200 || m["status"] != "pending-confirmation" || m["confirmId"] != id {
		t.Fatalf("after close: %d %s", r.status, r.body)
	}
	if ps := e.cm.PendingFor(tid); len(ps) != 1 || ps[0].ConfirmID != id {
		t.Fatalf("the approval did not stay pending: %+v", ps)
	}
	if n := lap.HeldTabs(e.lap); n != 0 {
		t.Errorf("%d tids still held after the call", n)
	}
	// The tab comes back, is shown the approval again, and the human approves.
	waitStatus(t, e, tid, tokens.StatusPendingResume)
	tab2 := e.dial(token, lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	if _, err := tab2.WaitFor(ctxT(t), "confirm-sync"); err != nil {
		t.Fatal(err)
	}
	if err := tab2.Approve(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if r := e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":10000}`); !strings.Contains(string(r.body), `"status":"confirmed"`) {
		t.Errorf("after re-pair: %d %s", r.status, r.body)
	}
}

// /confirm-result's long poll ends with still-pending when the tab closes.
func TestConfirmResultEndsOnClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := confirmTab(e)
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"approvalTimeoutMs":0}`)
	id, _ := r.json(t)["confirmId"].(string)
	if id == "" {
		t.Fatalf("no approval: %s", r.body)
	}
	waiting := make(chan struct{}, 1)
	lap.SetApprovalWaitHook(e.lap, func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	})
	done := make(chan resp, 1)
	go func() {
		done <- e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":120000}`)
	}()
	<-waiting
	tab.Close()
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("/confirm-result still waits 60 s after the tab closed (timeoutMs 120000)")
	}
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"still-pending"`) {
		t.Errorf("after close: %d %s", r.status, r.body)
	}
	if ps := e.cm.PendingFor(e.tids()[0]); len(ps) != 1 {
		t.Errorf("the approval did not stay pending: %+v", ps)
	}
}

// Error details say what to do (the reference's bridge shows the model only
// code and detail).

// detailCase is an answer and what its detail must say (and not echo).
type detailCase struct {
	name   string
	r      resp
	status int
	code   string
	want   []string
	not    string
}

func TestErrorDetails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.LAPBurst = 1; c.lap.MintBurst = 2 })
	token, _, _ := e.paired()
	bogus := "agt_" + strings.Repeat("A", 43)
	big := `{"text":"` + strings.Repeat("x", 1<<20) + `"}`
	tests := []detailCase{
		{"basic auth", e.do("POST", "/agent/lap/v1/actions", "", "", "Authorization", "Basic eDp5"), 401, "auth-failed", []string{"Bearer scheme"}, ""},
		{"no header", e.do("POST", "/agent/lap/v1/actions", "", ""), 401, "auth-failed", []string{"Authorization: Bearer"}, ""},
		{"unknown token", e.lapCall(bogus, "/actions", ""), 401, "auth-failed", []string{"unknown or expired", "resume/claim", "new connect line"}, bogus},
		{"malformed token", e.lapCall("agt_nope", "/actions", ""), 401, "auth-failed", []string{"unknown or expired"}, "agt_nope"},
		{"LAP body too large", e.lapCall(token, "/narrate", big), 413, "payload-too-large", []string{"1 MiB", "smaller body", "split"}, ""},
		{"meta body too large", e.do("POST", "/agent/mint", "", `{"x":"`+strings.Repeat("x", 64<<10)+`"}`), 413, "payload-too-large", []string{"64 KiB", "smaller body"}, ""},
		{"meta origin", e.do("POST", "/agent/mint", "", "", "Origin", "https://evil.example"), 403, "forbidden-origin", []string{`"https://evil.example"`, `lapd's own origin, "` + e.srv.URL + `",`, "--origins", "Config.Origins"}, ""},
		{"ws origin", e.do("GET", "/agent/ws", token, "", "Origin", "https://evil.example", "Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), 403, "forbidden-origin", []string{"--origins", "Config.Origins"}, ""},
	}
	// the LAP rate: burst 1, so the second call is refused
	if r := e.lapCall(token, "/actions", ""); r.status != 200 {
		t.Fatalf("first call: %d %s", r.status, r.body)
	}
	tests = append(tests, detailCase{"LAP rate", e.lapCall(token, "/actions", ""), 429, "rate-limited", []string{"30 calls a minute (bursts of 1)", "Retry-After", "wait 2 s"}, ""})
	var mint resp
	for range 3 {
		mint = e.do("POST", "/agent/mint", "", "")
	}
	tests = append(tests, detailCase{"mint rate", mint, 429, "rate-limited", []string{"30 mints and resume/claims a minute (bursts of 2)", "wait 2 s"}, ""})
	for _, tc := range tests {
		if tc.r.status != tc.status || tc.r.code() != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, tc.r.status, tc.r.body, tc.status, tc.code)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(tc.r.detail(), w) {
				t.Errorf("%s: detail %q lacks %q", tc.name, tc.r.detail(), w)
			}
		}
		if tc.not != "" && strings.Contains(string(tc.r.body), tc.not) {
			t.Errorf("%s: the body echoes %q: %s", tc.name, tc.not, tc.r.body)
		}
	}
}

// A /message the tab does not answer in time may have run: the 504 says to
// observe first.
func TestMessageTimeoutDetail(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := make(chan struct{})
	token, _, _ := e.paired(lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
		<-release
		return map[string]any{"status": "dispatched"}, nil
	}))
	t.Cleanup(func() { close(release) }) // before the tab's Abort, which waits for its handlers
	r := e.lapCall(token, "/message", `{"msg":{"type":"inc"},"timeoutMs":1}`)
	if r.status != 504 || r.code() != "timeout" {
		t.Fatalf("%d %s, want 504 timeout", r.status, r.body)
	}
	for _, w := range []string{"may have run", "observe", "idempotencyKey"} {
		if !strings.Contains(r.detail(), w) {
			t.Errorf("/message 504 detail %q lacks %q", r.detail(), w)
		}
	}
}

// A tab refused for its LAP version: paused says the client is too old, not
// "retry in a few seconds", which never helps.
func TestPausedAfterVersionSkew(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.tok.Grace = time.Minute })
	token, tid := e.mint()
	// lapd answers hello-ack (minClientVersion 2), then closes with 4426.
	if old, err := lapdtest.Dial(ctxT(t), e.srv.URL+"/agent/ws", token, lapdtest.WithLapVersion(1)); err == nil {
		t.Cleanup(old.Abort)
		select {
		case <-old.Done():
		case <-ctxT(t).Done():
			t.Fatal("a lapVersion 1 tab was kept")
		}
		if c := old.CloseStatus(); c != 4426 {
			t.Fatalf("lapVersion 1 tab closed with %d, want 4426", c)
		}
	}
	waitStatus(t, e, tid, tokens.StatusPendingResume)
	r := e.lapCall(token, "/actions", "")
	if r.status != 503 || r.code() != "paused" || !strings.Contains(r.detail(), "lapd client is too old") ||
		!strings.Contains(r.detail(), "retrying will not help") || strings.Contains(r.detail(), "retry in a few seconds") {
		t.Errorf("after version skew: %d %s", r.status, r.body)
	}
	// A tab of the same session that speaks LAP 2 clears it.
	e.dial(token)
	if r := e.lapCall(token, "/actions", ""); r.status != 200 {
		t.Errorf("after a good tab: %d %s", r.status, r.body)
	}
}

// A claim by another signed-in user says what to do, and the same whether
// the tid exists or not.
func TestClaimByAnotherUserDetail(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) {
		c.noAnon = true
		c.lap.Identity = lap.IdentityFunc(func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil })
	})
	m := e.do("POST", "/agent/mint", "", "", "X-User", "alice")
	if m.status != 200 {
		t.Fatalf("mint: %d %s", m.status, m.body)
	}
	tid := m.json(t)["tid"].(string)
	other := e.do("POST", "/agent/resume/claim", "", `{"tid":"`+tid+`"}`, "X-User", "bob")
	none := e.do("POST", "/agent/resume/claim", "", `{"tid":"tid-that-does-not-exist"}`, "X-User", "bob")
	if other.status != 403 || other.code() != "revoked" || !strings.Contains(other.detail(), "signed-in user who minted it") || !strings.Contains(other.detail(), "mint a new session") {
		t.Errorf("claim by another user: %d %s", other.status, other.body)
	}
	if other.detail() != none.detail() || none.status != 403 {
		t.Errorf("a tid's existence shows: %s vs %s", other.body, none.body)
	}
}

// The close signals calls hold are not kept for tabs that are not
// connected here: a refused call leaves nothing behind.
func TestTabGoneNotKept(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _ := e.mint()
	for _, route := range []string{"/message", "/confirm-result"} {
		if r := e.lapCall(token, route, `{"msg":{"type":"inc"},"confirmId":"x"}`); r.status != 503 {
			t.Errorf("%s unpaired: %d %s", route, r.status, r.body)
		}
	}
	if n := lap.HeldTabs(e.lap); n != 0 {
		t.Errorf("%d close signals kept for a tid with no tab", n)
	}
}
