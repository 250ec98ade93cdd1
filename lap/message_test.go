package lap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/tokens"
)

func TestServerSidePolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, tab := e.paired(lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	tests := []struct {
		route, body, reason string
	}{
		{"/message", `{"msg":{"type":"reset"}}`, "human-only"},
		{"/message", `{"msg":{"type":"launchMissiles"}}`, "invalid"},
		{"/message", `{"msg":{"type":"addTodo","title":""}}`, "schema-error"},
		{"/message", `{"msg":{"type":"addTodo","title":"x","extra":1}}`, "schema-error"},
		{"/would-dispatch", `{"msg":{"type":"reset"}}`, "human-only"},
		{"/would-dispatch", `{"msg":{"type":"nope"}}`, "invalid"},
		{"/would-dispatch", `{"msg":{"type":"addTodo","title":""}}`, "schema-mismatch"},
	}
	for _, tc := range tests {
		r := e.lapCall(token, tc.route, tc.body)
		m := r.json(t)
		if r.status != 200 || m["status"] != "rejected" || m["reason"] != tc.reason {
			t.Errorf("%s %s: %d %s, want rejected/%s", tc.route, tc.body, r.status, r.body, tc.reason)
		}
	}
	if n := tab.RPCCount("send_message") + tab.RPCCount("would_dispatch"); n != 0 {
		t.Errorf("%d rpc frames reached the tab", n)
	}
	if n := len(e.sink.events(audit.EventMsgBlocked)); n != len(tests) {
		t.Errorf("msg-blocked audited %d times, want %d", n, len(tests))
	}
	// The /message refusals are "blocked" entries in /recent-actions, newest
	// first, as the tab's own refusals are; a prediction refused is not an action.
	var ra struct {
		Entries []struct{ Kind, Variant, Intent, Detail string }
	}
	if err := json.Unmarshal(e.lapCall(token, "/recent-actions", `{"kind":"blocked"}`).body, &ra); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, en := range ra.Entries {
		got = append(got, en.Variant+"|"+strings.SplitN(en.Detail, ":", 2)[0])
	}
	if want := "addTodo|schema-error addTodo|schema-error launchMissiles|invalid reset|human-only"; strings.Join(got, " ") != want {
		t.Errorf("recent-actions blocked: %s, want %s", got, want)
	}
	if len(ra.Entries) == 4 && (ra.Entries[3].Intent != "Reset (humans only)" || !strings.Contains(ra.Entries[3].Detail, "ask them")) {
		t.Errorf("blocked reset entry: %+v", ra.Entries[3])
	}
	// The tab is told, to show them in its feed (log-show is not echoed).
	for i := 0; i < 4; i++ {
		f, err := tab.WaitFor(ctxT(t), "log-show")
		if err != nil || !strings.Contains(string(f.Raw), `"kind":"blocked"`) {
			t.Fatalf("log-show %d: %s %v", i, f.Raw, err)
		}
	}
	// /would-dispatch answers a schema failure in the reference runtime's
	// shape: reason schema-mismatch, errors [{path, code, message}].
	wd := e.lapCall(token, "/would-dispatch", `{"msg":{"type":"addTodo","title":"","extra":1}}`).body
	if b := string(wd); !strings.Contains(b, `"reason":"schema-mismatch"`) ||
		!strings.Contains(b, `{"path":"extra","code":"unexpected-field","message":"property is not allowed","pointer":"/extra"}`) ||
		!strings.Contains(b, `{"path":"title","code":"validates-failed"`) {
		t.Errorf("would-dispatch schema failure: %s", b)
	}
	r := e.lapCall(token, "/message", `{"msg":{"type":"addTodo","title":"milk"}}`)
	if !strings.Contains(string(r.body), `"dispatched"`) || tab.RPCCount("send_message") != 1 {
		t.Errorf("valid msg: %d %s", r.status, r.body)
	}
}

func TestIdempotentMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := make(chan struct{})
	var calls sync.WaitGroup
	calls.Add(1)
	var once sync.Once
	token, tid, tab := e.paired(lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
		once.Do(calls.Done)
		<-release
		return map[string]any{"status": "dispatched", "stateDiff": []any{map[string]any{"op": "replace", "path": "/count", "value": 1}}}, nil
	}))
	body := `{"msg":{"type":"inc"},"idempotencyKey":"k1"}`
	var wg sync.WaitGroup
	out := make([]resp, 3)
	for i := range out {
		wg.Add(1)
		go func() { defer wg.Done(); out[i] = e.lapCall(token, "/message", body) }()
	}
	calls.Wait()
	close(release)
	wg.Wait()
	for i, r := range out {
		if r.status != 200 || string(r.body) != string(out[0].body) {
			t.Errorf("call %d: %d %s vs %s", i, r.status, r.body, out[0].body)
		}
	}
	if n := tab.RPCCount("send_message"); n != 1 {
		t.Errorf("send_message reached the tab %d times", n)
	}
	// across a reconnect: same tid, same key → no new dispatch
	tab.Close()
	tab2 := e.dial(token)
	_ = tid
	r := e.lapCall(token, "/message", body)
	if r.status != 200 || string(r.body) != string(out[0].body) || tab2.RPCCount("send_message") != 0 {
		t.Errorf("after reconnect: %d %s (rpcs %d)", r.status, r.body, tab2.RPCCount("send_message"))
	}
	// a different key dispatches
	if r := e.lapCall(token, "/message", `{"msg":{"type":"inc"},"idempotencyKey":"k2"}`); r.status != 200 || tab2.RPCCount("send_message") != 1 {
		t.Errorf("new key: %d %s", r.status, r.body)
	}
	// One entry per call: the two dispatches as msg-dispatched, the three
	// answers from the kept result as lap-call send_message.
	if n := len(e.sink.events(audit.EventMsgDispatched)); n != 2 {
		t.Errorf("%d msg-dispatched entries, want 2", n)
	}
	replays := 0
	for _, en := range e.sink.events(audit.EventLapCall) {
		if en.Detail["tool"] == "send_message" {
			replays++
			if en.Detail["variant"] != "inc" {
				t.Errorf("replay entry %v, want variant inc", en.Detail)
			}
		}
	}
	if replays != 3 {
		t.Errorf("%d lap-call send_message entries, want 3 (two waiters and the retry after the reconnect)", replays)
	}
}

func confirmTab(e *env) (string, *lapdtest.Tab) {
	token, _, tab := e.paired(lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	return token, tab
}

func pendingID(t *testing.T, tab *lapdtest.Tab) string {
	t.Helper()
	f, err := tab.WaitFor(ctxT(t), "rpc")
	if err != nil {
		t.Fatal(err)
	}
	_ = f
	// the tab records the pending entry before replying
	for range 1000 {
		if ids := tab.PendingConfirms(); len(ids) == 1 {
			return ids[0]
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no pending confirm")
	return ""
}

func TestConfirmApproveInLongPoll(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := confirmTab(e)
	done := make(chan resp, 1)
	go func() {
		done <- e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"reason":"tidy","timeoutMs":10000}`)
	}()
	id := pendingID(t, tab)
	// the proposal must be recorded by the server before we approve; poll confirm PendingFor
	waitPending(t, e, id)
	if err := tab.Approve(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"confirmed"`) || !strings.Contains(string(r.body), `"stateAfter":{`) {
		t.Errorf("approve: %d %s", r.status, r.body)
	}
	if len(e.sink.events(audit.EventConfirmProposed)) != 1 || len(e.sink.events(audit.EventConfirmApproved)) != 1 {
		t.Error("confirm not audited")
	}
}

// approvalTimeoutMs (a lapd addition) separates the human's time from the
// drain timeout: 0 answers pending-confirmation at once even with a long
// timeoutMs, and a long one waits for the approval with a short timeoutMs.
func TestApprovalTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := confirmTab(e)
	start := time.Now()
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":60000,"approvalTimeoutMs":0}`)
	if m := r.json(t); m["status"] != "pending-confirmation" || time.Since(start) > 30*time.Second {
		t.Fatalf("approvalTimeoutMs 0: %s after %v", r.body, time.Since(start))
	}
	first := r.json(t)["confirmId"].(string)
	if err := tab.Reject(ctxT(t), first); err != nil {
		t.Fatal(err)
	}
	done := make(chan resp, 1)
	go func() {
		done <- e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1,"approvalTimeoutMs":30000}`)
	}()
	var id string
	for deadline := time.Now().Add(10 * time.Second); id == "" || id == first; time.Sleep(time.Millisecond) {
		// the tab records the pending entry before replying; no frame to wait on
		if ids := tab.PendingConfirms(); len(ids) == 1 {
			id = ids[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("the second clearAll was never proposed")
		}
	}
	waitPending(t, e, id)
	if err := tab.Approve(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if r := <-done; !strings.Contains(string(r.body), `"status":"confirmed"`) {
		t.Fatalf("approvalTimeoutMs 30000 with timeoutMs 1: %s", r.body)
	}
}

func waitPending(t *testing.T, e *env, id string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, tid := range e.tids() {
			for _, p := range e.cm.PendingFor(tid) {
				if p.ConfirmID == id {
					return
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("confirm %s never proposed", id)
}

func (e *env) tids() []string {
	var out []string
	for _, en := range e.sink.events(audit.EventMint) {
		out = append(out, en.TID)
	}
	return out
}

func TestConfirmRejectAndPollGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := confirmTab(e)
	// short long-poll: the agent gets pending-confirmation
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1}`)
	m := r.json(t)
	if m["status"] != "pending-confirmation" || m["confirmId"] == "" {
		t.Fatalf("short poll: %s", r.body)
	}
	id := m["confirmId"].(string)
	if r := e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":1}`); !strings.Contains(string(r.body), "still-pending") {
		t.Errorf("still-pending: %s", r.body)
	}
	// approval in the poll gap is not lost (level-triggered)
	if err := tab.Approve(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	r = e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":5000}`)
	if !strings.Contains(string(r.body), `"status":"confirmed"`) {
		t.Errorf("after gap: %d %s", r.status, r.body)
	}
	// reject path
	r = e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1}`)
	id2 := r.json(t)["confirmId"].(string)
	if err := tab.Reject(ctxT(t), id2); err != nil {
		t.Fatal(err)
	}
	r = e.lapCall(token, "/confirm-result", `{"confirmId":"`+id2+`","timeoutMs":5000}`)
	if !strings.Contains(string(r.body), `"status":"rejected"`) || !strings.Contains(string(r.body), "user-cancelled") {
		t.Errorf("reject: %s", r.body)
	}
	if _, err := tab.WaitFor(ctxT(t), "confirm-expire"); err != nil {
		t.Error(err)
	}
	if len(e.sink.events(audit.EventConfirmRejected)) == 0 {
		t.Error("reject not audited")
	}
}

func TestConfirmExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.conf.Expiry = 50 * time.Millisecond })
	token, tab := confirmTab(e)
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1}`)
	id := r.json(t)["confirmId"].(string)
	f, err := tab.WaitFor(ctxT(t), "confirm-expire")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(f.Raw), id) || !strings.Contains(string(f.Raw), `"reason":"timeout"`) {
		t.Errorf("confirm-expire frame %s", f.Raw)
	}
	r = e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":1000}`)
	if !strings.Contains(string(r.body), `"reason":"timeout"`) {
		t.Errorf("after expiry: %s", r.body)
	}
	if len(e.sink.events(audit.EventConfirmExpired)) != 1 {
		t.Error("expiry not audited")
	}
}

// A recorded proposal is sent back to its tab with lapd's deadline, which
// the tab's own proposal cannot know (its prompt says when it lapses), also
// for a /message without an idempotencyKey.
func TestConfirmSyncAfterProposal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := confirmTab(e)
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1}`)
	id := r.json(t)["confirmId"].(string)
	f, err := tab.WaitFor(ctxT(t), "confirm-sync")
	if err != nil {
		t.Fatal(err)
	}
	var sync struct {
		Pending []struct {
			ConfirmID string `json:"confirmId"`
			ExpiresAt int64  `json:"expiresAt"`
		} `json:"pending"`
	}
	if err := json.Unmarshal(f.Raw, &sync); err != nil || len(sync.Pending) != 1 || sync.Pending[0].ConfirmID != id {
		t.Fatalf("confirm-sync %s, want approval %s only (%v)", f.Raw, id, err)
	}
	ps := e.cm.PendingFor(e.tids()[0])
	if len(ps) != 1 || sync.Pending[0].ExpiresAt != ps[0].ExpiresAt || sync.Pending[0].ExpiresAt <= time.Now().UnixMilli() {
		t.Errorf("confirm-sync expiresAt %d, want the recorded deadline %+v", sync.Pending[0].ExpiresAt, ps)
	}
}

func TestConfirmSyncOnReconnect(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tab := confirmTab(e)
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":1}`)
	id := r.json(t)["confirmId"].(string)
	tab.Close()
	waitStatus(t, e, e.tids()[0], tokens.StatusPendingResume)
	tab2 := e.dial(token, lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	if _, err := tab2.WaitFor(ctxT(t), "active"); err != nil { // pushed first
		t.Errorf("re-pair did not push active: %v", err)
	}
	f, err := tab2.WaitFor(ctxT(t), "confirm-sync")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(f.Raw), id) {
		t.Errorf("confirm-sync %s lacks %s", f.Raw, id)
	}
}

func TestDrain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	token, _, _ := e.paired(lapdtest.WithHandler("list_actions", func(json.RawMessage) (any, *lapdtest.RPCError) {
		close(entered)
		<-release
		return map[string]any{"actions": []any{}}, nil
	}))
	done := make(chan resp, 1)
	go func() { done <- e.lapCall(token, "/actions", "") }()
	<-entered
	e.lap.Drain()
	r := e.lapCall(token, "/state", "")
	if r.status != 503 || r.code() != "shutting-down" || r.header.Get("Retry-After") == "" {
		t.Errorf("new call while draining: %d %v %s", r.status, r.header, r.body)
	}
	if r := e.do("POST", "/agent/mint", "", ""); r.code() != "shutting-down" {
		t.Errorf("mint while draining: %s", r.body)
	}
	// Every refusal is audited, these two too (they were not: an operator
	// counting the 503s of a restart found fewer refused entries).
	refused := map[string]bool{}
	for _, en := range e.sink.events(audit.EventRefused) {
		if en.Detail["code"] == "shutting-down" {
			refused[en.Detail["endpoint"].(string)] = true
		}
	}
	if !refused["/agent/lap/v1/state"] || !refused["/agent/mint"] {
		t.Errorf("refusals while draining audited for %v, want /agent/lap/v1/state and /agent/mint", refused)
	}
	idle := make(chan error, 1)
	go func() { idle <- e.lap.WaitIdle(context.Background()) }()
	close(release)
	if r := <-done; r.status != 200 {
		t.Errorf("in-flight call: %d %s", r.status, r.body)
	}
	if err := <-idle; err != nil {
		t.Error(err)
	}
}

// The review's double dispatches: the tab drops right after dispatching
// (503 paused), or answers after the call's deadline (504). The MCP executor
// retries with the same idempotencyKey; the retry must not dispatch again:
// it is answered 409 outcome-unknown ("observe before retrying").
func TestIdempotencyKeyNeverDispatchesTwice(t *testing.T) {
	t.Parallel()
	t.Run("drop after dispatch", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		var mu sync.Mutex
		dispatched := map[string]int{}
		var tab *lapdtest.Tab
		got := make(chan struct{}, 1)
		stop := make(chan struct{})
		handler := lapdtest.WithHandler("send_message", func(args json.RawMessage) (any, *lapdtest.RPCError) {
			var a struct {
				IdempotencyKey   string `json:"idempotencyKey"`
				IdempotencyTTLMs int64  `json:"idempotencyTtlMs"`
			}
			_ = json.Unmarshal(args, &a)
			if a.IdempotencyKey == "" || a.IdempotencyTTLMs <= 0 {
				t.Errorf("rpc args without the key: %s", args)
			}
			mu.Lock()
			dispatched[a.IdempotencyKey]++
			mu.Unlock()
			got <- struct{}{}
			<-stop // never answers: the socket drops first
			return nil, &lapdtest.RPCError{Code: "internal"}
		})
		token, _ := e.mint()
		tab = e.dial(token, handler)
		body := `{"msg":{"type":"inc"},"idempotencyKey":"k1"}`
		done := make(chan resp, 1)
		go func() { done <- e.lapCall(token, "/message", body) }()
		<-got
		tab.Kill() // the socket drops; the handler is still "running"
		close(stop)
		if r := <-done; r.status != 503 || r.code() != "paused" {
			t.Fatalf("first call: %d %s", r.status, r.body)
		}
		tab2 := e.dial(token)
		r := e.lapCall(token, "/message", body)
		if r.status != 409 || r.code() != "outcome-unknown" || !strings.Contains(string(r.body), "observe before retrying") {
			t.Errorf("retry: %d %s, want 409 outcome-unknown", r.status, r.body)
		}
		if n := tab2.RPCCount("send_message"); n != 0 {
			t.Errorf("the retry dispatched again (%d rpc frames)", n)
		}
		mu.Lock()
		defer mu.Unlock()
		if dispatched["k1"] != 1 {
			t.Errorf("dispatched %d times", dispatched["k1"])
		}
	})
	t.Run("slow tab", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		release := make(chan struct{})
		finished := make(chan struct{}, 8)
		n := 0
		var mu sync.Mutex
		token, _, _ := e.paired(lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
			mu.Lock()
			n++
			mu.Unlock()
			defer func() { finished <- struct{}{} }()
			<-release
			return map[string]any{"status": "dispatched", "stateDiff": []any{}}, nil
		}))
		body := `{"msg":{"type":"inc"},"idempotencyKey":"k2","timeoutMs":0}`
		if r := e.lapCall(token, "/message", body); r.status != 504 {
			t.Fatalf("first call: %d %s, want 504", r.status, r.body)
		}
		r := e.lapCall(token, "/message", body)
		close(release)
		<-finished
		if r.status != 409 || r.code() != "outcome-unknown" {
			t.Errorf("retry: %d %s, want 409 outcome-unknown", r.status, r.body)
		}
		mu.Lock()
		defer mu.Unlock()
		if n != 1 {
			t.Errorf("dispatched %d times", n)
		}
	})
}

// A tab that answers with a confirmId already pending used to get the LLM a
// 500. The same approval again (a retry whose tab de-duplicated by key) is
// the same pending approval; a reused id for another action is 409 conflict.
func TestReusedConfirmID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid, _ := e.paired(lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
		return map[string]any{"status": "pending-confirmation", "confirmId": "c-fixed"}, nil
	}))
	for range 2 {
		r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":0}`)
		if r.status != 200 || r.json(t)["confirmId"] != "c-fixed" {
			t.Fatalf("same approval: %d %s", r.status, r.body)
		}
	}
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll","all":true},"timeoutMs":0}`)
	if r.status != 409 || r.code() != "conflict" {
		t.Errorf("reused id, other payload: %d %s, want 409 conflict", r.status, r.body)
	}
	if p := e.cm.PendingFor(tid); len(p) != 1 || string(p[0].Payload) != `{}` {
		t.Errorf("pending = %+v, want the first approval only", p)
	}
}

// /confirm-result with timeoutMs 0 on an answered approval answers it, never
// 200 null (the two waits inside raced an expired context).
func TestConfirmResultTimeoutZero(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid, tab := e.paired(lapdtest.WithPolicy(lapdtest.DemoPolicy()))
	r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":0}`)
	id, _ := r.json(t)["confirmId"].(string)
	if id == "" {
		t.Fatalf("/message: %d %s", r.status, r.body)
	}
	if err := tab.Approve(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	for {
		if p := e.cm.PendingFor(tid); len(p) == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for range 20 { // within the per-session rate (30)
		r := e.lapCall(token, "/confirm-result", `{"confirmId":"`+id+`","timeoutMs":0}`)
		if r.status != 200 || !strings.Contains(string(r.body), `"status":"confirmed"`) {
			t.Fatalf("/confirm-result: %d %s", r.status, r.body)
		}
	}
}

// An approval lapd refused to record (too many pending in the session) was
// taken back from the tab; a retry of the same /message (same
// idempotencyKey, so the tab answers the same confirmId from its memory)
// reads rejected/too-many-pending at once instead of recording an approval
// nobody sees and waiting for it until expiry.
func TestTooManyPendingRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.conf.PendingBytesPerTID = 1600 }) // one approval with a 300-byte pad (about 1,480 bytes) fits, two do not
	var mu sync.Mutex
	ids := map[string]string{} // idempotencyKey → confirmId, as lapd.js keeps them
	token, tid, tab := e.paired(lapdtest.WithHandler("send_message", func(args json.RawMessage) (any, *lapdtest.RPCError) {
		var a struct {
			Key string `json:"idempotencyKey"`
		}
		_ = json.Unmarshal(args, &a)
		mu.Lock()
		defer mu.Unlock()
		if ids[a.Key] == "" {
			ids[a.Key] = fmt.Sprintf("c-%d", len(ids))
		}
		return map[string]any{"status": "pending-confirmation", "confirmId": ids[a.Key]}, nil
	}))
	pad := strings.Repeat("x", 300)
	if r := e.lapCall(token, "/message", `{"msg":{"type":"clearAll","pad":"`+pad+`"},"idempotencyKey":"k1","timeoutMs":0}`); r.status != 200 || r.json(t)["confirmId"] != "c-0" {
		t.Fatalf("first approval: %d %s", r.status, r.body)
	}
	body := `{"msg":{"type":"clearAll","pad":"` + pad + `"},"idempotencyKey":"k2","timeoutMs":5000}`
	if r := e.lapCall(token, "/message", body); r.status != 429 {
		t.Fatalf("second approval: %d %s, want 429", r.status, r.body)
	}
	if f, err := tab.WaitFor(ctxT(t), "confirm-expire"); err != nil || !strings.Contains(string(f.Raw), `"c-1"`) {
		t.Fatalf("the tab was not told to take c-1 back: %s %v", f.Raw, err)
	}
	// The human answers c-0, which makes room; then the executor retries.
	if err := tab.Approve(ctxT(t), "c-0"); err != nil {
		t.Fatal(err)
	}
	for len(e.cm.PendingFor(tid)) > 0 {
		time.Sleep(time.Millisecond)
	}
	r := e.lapCall(token, "/message", body)
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"rejected"`) || !strings.Contains(string(r.body), `"reason":"too-many-pending"`) {
		t.Fatalf("retry: %d %s, want rejected/too-many-pending (not an approval nobody sees)", r.status, r.body)
	}
	if p := e.cm.PendingFor(tid); len(p) != 0 {
		t.Errorf("pending %+v, want none", p)
	}
}

// A tab that re-pairs before any model used its token (the human reloaded
// the page before pasting the line) is pushed the reference's {t:'active'}
// with lapd's "model":false; the model's first call then pushes
// {t:'active'}, once.
func TestRepairBeforeAnyModelCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid, tab := e.paired()
	if _, err := tab.WaitFor(ctxT(t), "hello-ack"); err != nil {
		t.Fatal(err)
	}
	tab.Close()
	waitStatus(t, e, tid, tokens.StatusPendingResume)
	tab2 := e.dial(token)
	f, err := tab2.WaitFor(ctxT(t), "active")
	if err != nil || string(f.Raw) != `{"t":"active","model":false}` {
		t.Fatalf("re-pair before any model call pushed %s (%v), want {\"t\":\"active\",\"model\":false}", f.Raw, err)
	}
	if r := e.lapCall(token, "/observe", `{}`); r.status != 200 {
		t.Fatalf("observe: %d %s", r.status, r.body)
	}
	if f, err = tab2.WaitFor(ctxT(t), "active"); err != nil || string(f.Raw) != `{"t":"active"}` {
		t.Fatalf("the model's first call pushed %s (%v), want {\"t\":\"active\"}", f.Raw, err)
	}
	for range 2 {
		if r := e.lapCall(token, "/observe", `{}`); r.status != 200 {
			t.Fatalf("observe: %d %s", r.status, r.body)
		}
	}
	// Each call's handler (and its push, if any) ended before the next
	// call's rpc was sent: one active frame after the first call's only.
	frames := tab2.Frames()
	last, actives := -1, 0
	for i, f := range frames {
		if f.T == "rpc" {
			last = i
		}
	}
	for _, f := range frames[:last+1] {
		if f.T == "active" {
			actives++
		}
	}
	if last < 0 || actives != 2 {
		t.Errorf("%d active frames before the last call's rpc (frames %d, last rpc at %d), want 2", actives, len(frames), last)
	}
	// Used, the next re-pair is the reference's.
	tab2.Close()
	waitStatus(t, e, tid, tokens.StatusPendingResume)
	tab3 := e.dial(token)
	if f, err = tab3.WaitFor(ctxT(t), "active"); err != nil || string(f.Raw) != `{"t":"active"}` {
		t.Fatalf("re-pair after a model's call pushed %s (%v), want {\"t\":\"active\"}", f.Raw, err)
	}
}

// H3 of the review, through LAP: other sessions filling lapd's pending
// approval budget no longer refuse a fresh session's approval (429 "too many
// approvals are waiting in this session", and its prompt withdrawn). The
// session holding the most loses its oldest approval instead, as on expiry:
// its tab is told (confirm-expire, reason too-many-pending), the expiry is
// audited, and /confirm-result answers rejected/too-many-pending.
func TestPendingBudgetFullOtherSessions(t *testing.T) {
	t.Parallel()
	// An approval with a 300-byte pad costs about 1,480 bytes: two fit in a
	// session, three sessions' worth (two + one) fit in all, and a small one
	// more does not.
	e := newEnv(t, func(c *envCfg) { c.conf.PendingBytesPerTID, c.conf.PendingBytes = 3100, 4700 })
	proposer := func(prefix string) lapdtest.Option {
		var n atomic.Int64
		return lapdtest.WithHandler("send_message", func(json.RawMessage) (any, *lapdtest.RPCError) {
			return map[string]any{"status": "pending-confirmation", "confirmId": fmt.Sprint(prefix, n.Add(1)-1)}, nil
		})
	}
	pad := strings.Repeat("x", 300)
	big := `{"msg":{"type":"clearAll","pad":"` + pad + `"},"timeoutMs":0}`
	heavyTok, heavyTID, heavyTab := e.paired(proposer("heavy-"))
	otherTok, _, _ := e.paired(proposer("other-"))
	for _, c := range []struct{ token, body string }{{heavyTok, big}, {heavyTok, big}, {otherTok, big}} {
		if r := e.lapCall(c.token, "/message", c.body); r.status != 200 || r.json(t)["status"] != "pending-confirmation" {
			t.Fatalf("filling: %d %s", r.status, r.body)
		}
	}
	honestTok, honestTID, honestTab := e.paired(proposer("honest-"))
	r := e.lapCall(honestTok, "/message", `{"msg":{"type":"clearAll"},"timeoutMs":0}`)
	if r.status != 200 || r.json(t)["confirmId"] != "honest-0" {
		t.Fatalf("fresh session's approval: %d %s; want it recorded, pending", r.status, r.body)
	}
	if p := e.cm.PendingFor(honestTID); len(p) != 1 {
		t.Errorf("honest session pending %+v, want its approval", p)
	}
	f, err := heavyTab.WaitFor(ctxT(t), "confirm-expire")
	if err != nil || !strings.Contains(string(f.Raw), `"confirmId":"heavy-0"`) || !strings.Contains(string(f.Raw), `"reason":"too-many-pending"`) {
		t.Fatalf("heaviest session's tab: %s %v; want confirm-expire heavy-0, too-many-pending", f.Raw, err)
	}
	if p := e.cm.PendingFor(heavyTID); len(p) != 1 || p[0].ConfirmID != "heavy-1" {
		t.Errorf("heaviest session pending %+v, want heavy-1 only", p)
	}
	r = e.lapCall(heavyTok, "/confirm-result", `{"confirmId":"heavy-0","timeoutMs":0}`)
	if !strings.Contains(string(r.body), `"status":"rejected"`) || !strings.Contains(string(r.body), `"reason":"too-many-pending"`) {
		t.Errorf("/confirm-result of the expired approval: %d %s", r.status, r.body)
	}
	ex := e.sink.events(audit.EventConfirmExpired)
	if len(ex) != 1 || ex[0].TID != heavyTID || ex[0].Detail["reason"] != "too-many-pending" {
		t.Errorf("confirm-expired audit entries %+v, want one for the heaviest session with its reason", ex)
	}
	// The honest tab was never told to take its prompt back: nothing
	// before the rpc of a later call.
	if r := e.lapCall(honestTok, "/observe", `{}`); r.status != 200 {
		t.Fatalf("observe: %d %s", r.status, r.body)
	}
	for _, f := range honestTab.Frames() {
		if f.T == "confirm-expire" {
			t.Errorf("honest tab told %s", f.Raw)
		}
	}
}
