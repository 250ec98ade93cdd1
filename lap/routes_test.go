package lap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/lap"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/tokens"
)

func TestRoutesSuccess(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, _ := e.paired()
	tests := []struct {
		route, body string
		want        []string // substrings of the 200 body
	}{
		{"/describe", "", []string{`"name":"lapdtest"`, `"schemaHash":"lapdtest-1"`, `"dispatchModel":"TEA"`}},
		{"/observe", "", []string{`"state":{`, `"actions":[`, `"description":{`, `"health":{"connected":true`, `"context":{`}},
		{"/state", `{"path":"/count"}`, []string{`{"state":0}`}},
		{"/state", ``, []string{`"state":{`}},
		{"/query-state", `{"path":"/todos"}`, []string{`"found":true`}},
		{"/actions", ``, []string{`"variant":"inc"`}},
		{"/message", `{"msg":{"type":"inc"}}`, []string{`"status":"dispatched"`, `"stateDiff":[`}},
		{"/would-dispatch", `{"msg":{"type":"inc"}}`, []string{`"status":"predicted"`}},
		{"/narrate", `{"text":"working on it"}`, []string{`{"ok":true}`}},
		{"/query-dom", `{"name":"list","multiple":1}`, []string{`"elements":[`}},
		{"/describe-visible", ``, []string{`"outline":[`}},
		{"/context", ``, []string{`"summary":"A fake tab"`}},
		{"/recent-actions", `{"n":3}`, []string{`"entries":[`}},
		{"/wait", `{"timeoutMs":1}`, []string{`{"status":"timeout","stateAfter":null}`}},
	}
	for _, tc := range tests {
		r := e.lapCall(token, tc.route, tc.body)
		if r.status != 200 {
			t.Errorf("%s %s: %d %s", tc.route, tc.body, r.status, r.body)
			continue
		}
		if ct := r.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: content-type %q", tc.route, ct)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(r.body), w) {
				t.Errorf("%s: body %s lacks %s", tc.route, r.body, w)
			}
		}
	}
	// GET is refused on LAP routes (the reference answers it with a null body)
	if r := e.do("GET", "/agent/lap/v1/actions", token, ""); r.status != 405 || r.header.Get("Allow") != "POST" || r.code() != "method-not-allowed" {
		t.Errorf("GET /actions: %d %v %s", r.status, r.header, r.body)
	}
	// One entry per call: lap-call, or for /message its outcome.
	if n := len(e.sink.events(audit.EventLapCall)) + len(e.sink.events(audit.EventMsgDispatched)); n < len(tests) {
		t.Errorf("calls audited %d times, want ≥ %d", n, len(tests))
	}
}

func TestRoutesBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, tab := e.paired()
	tests := []struct {
		route, body, detail string
	}{
		{"/state", `{"path":5}`, "path must be a string"},
		{"/query-state", `{}`, "path required"},
		{"/message", `{"msg":{"type":1}}`, "msg.type must be a string"},
		{"/message", `not json`, "not valid JSON"},
		{"/message", `{"msg":{"type":"inc"},"idempotencyKey":"` + strings.Repeat("k", 201) + `"}`, "idempotencyKey"},
		{"/narrate", `{"text":""}`, "text required"},
		{"/narrate", `{}`, "text required"},
		{"/query-dom", `{}`, "name required"},
		{"/would-dispatch", `{}`, "msg"},
		{"/confirm-result", `{}`, "confirmId required"},
		{"/confirm-result", `{"confirmId":"nope","timeoutMs":1}`, "unknown confirmId nope for this session (it was never proposed here, or its outcome is older than the keep window, 5 minutes by default): call observe"},
	}
	for _, tc := range tests {
		r := e.lapCall(token, tc.route, tc.body)
		if r.status != 400 || r.code() != "invalid" || !strings.Contains(string(r.body), tc.detail) {
			t.Errorf("%s %s: %d %s, want 400 invalid %q", tc.route, tc.body, r.status, r.body, tc.detail)
		}
	}
	if n := tab.RPCCount("send_message"); n != 0 {
		t.Errorf("send_message reached the tab %d times", n)
	}
	if r := e.lapCall(token, "/nope", ""); r.status != 404 || r.code() != "not-found" {
		t.Errorf("unknown route: %d %s", r.status, r.body)
	}
	if r := e.do("GET", "/agent/mint", "", ""); r.status != 405 || r.code() != "method-not-allowed" {
		t.Errorf("GET mint: %d %s", r.status, r.body)
	}
}

func TestGateOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.lap.MaxBody = 100; c.lap.LAPBurst = 1; c.lap.LAPRate = 0.0001 })
	token, _, _ := e.paired()
	unpaired, _ := e.mint()
	big := `{"text":"` + strings.Repeat("x", 200) + `"}`
	tests := []struct {
		name, token, body string
		status            int
		code              string
	}{
		{"oversize beats bad token", "agt_bogus", big, 413, "payload-too-large"},
		{"no bearer", "", "", 401, "auth-failed"},
		{"bad token beats unpaired", "agt_bogus", "", 401, "auth-failed"},
		{"malformed token", "nope", "", 401, "auth-failed"},
		{"first call passes", token, "", 200, ""},
		{"then rate limited", token, "", 429, "rate-limited"},
		{"unpaired beats rate limit", unpaired, "", 503, "paused"},
		{"unpaired again (not limited)", unpaired, "", 503, "paused"},
	}
	for _, tc := range tests {
		r := e.lapCall(tc.token, "/actions", tc.body)
		if r.status != tc.status || r.code() != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, r.status, r.body, tc.status, tc.code)
		}
		if tc.status == 429 {
			if r.header.Get("Retry-After") == "" || r.json(t)["error"].(map[string]any)["retryAfterMs"] == nil {
				t.Errorf("429 lacks Retry-After/retryAfterMs: %v %s", r.header, r.body)
			}
		}
	}
	// chunked body over the limit (no Content-Length)
	e2 := newEnv(t, func(c *envCfg) { c.lap.MaxBody = 100 })
	tok2, _, _ := e2.paired()
	req, _ := http.NewRequest("POST", e2.srv.URL+"/agent/lap/v1/narrate", strings.NewReader(big))
	req.ContentLength = -1
	req.TransferEncoding = []string{"chunked"}
	req.Header.Set("Authorization", "Bearer "+tok2)
	res, err := e2.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 413 {
		t.Errorf("chunked oversize: %d", res.StatusCode)
	}
	// refusals are audited
	if len(e.sink.events(audit.EventAuthFailed)) < 3 || len(e.sink.events(audit.EventRateLimited)) < 1 || len(e.sink.events(audit.EventRefused)) < 2 {
		t.Errorf("refusals not audited: auth=%d rate=%d refused=%d", len(e.sink.events(audit.EventAuthFailed)), len(e.sink.events(audit.EventRateLimited)), len(e.sink.events(audit.EventRefused)))
	}
}

func TestPausedHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.tok.Grace = 30 * time.Second })
	// minted, never connected: pending, Retry-After 5
	tok, _ := e.mint()
	r := e.lapCall(tok, "/observe", "")
	if r.status != 503 || r.header.Get("X-LLui-Reconnect") != "pending" || r.header.Get("Retry-After") != "5" {
		t.Errorf("awaiting-ws: %d %v %s", r.status, r.header, r.body)
	}
	if m := r.json(t)["error"].(map[string]any); m["reconnect"] != "pending" || !strings.Contains(m["detail"].(string), "retry in 5 s") {
		t.Errorf("body reconnect/detail: %v", m)
	}
	// connected then closed: pending-resume inside grace
	tok2, tid2, tab := e.paired()
	if r := e.lapCall(tok2, "/actions", ""); r.status != 200 {
		t.Fatalf("paired call: %d", r.status)
	}
	tab.Close()
	waitStatus(t, e, tid2, tokens.StatusPendingResume)
	r = e.lapCall(tok2, "/actions", "")
	ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != 503 || r.header.Get("X-LLui-Reconnect") != "pending" || ra < 1 || ra > 30 ||
		!strings.Contains(string(r.body), fmt.Sprintf("may reconnect within %d s", ra)) {
		t.Errorf("pending-resume: %d %v %s", r.status, r.header, r.body)
	}

	// grace 0: expired at once
	e0 := newEnv(t, func(c *envCfg) { c.tok.Grace = -1 })
	tok3, tid3, tab3 := e0.paired()
	tab3.Close()
	waitStatus(t, e0, tid3, tokens.StatusPendingResume)
	r = e0.lapCall(tok3, "/actions", "")
	if r.status != 503 || r.header.Get("X-LLui-Reconnect") != "expired" || r.header.Get("Retry-After") != "" ||
		!strings.Contains(string(r.body), "new connect line") {
		t.Errorf("expired: %d %v %s", r.status, r.header, r.body)
	}
}

// waitStatus waits until the registry has noticed a closed tab.
func waitStatus(t *testing.T, e *env, tid string, want tokens.Status) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err := e.tm.Get(ctxT(t), tid)
		if err == nil && rec.Status == want && !e.reg.IsPaired(tid) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tid %s: status %v (paired %v), want %v", tid, rec.Status, e.reg.IsPaired(tid), want)
		}
		time.Sleep(5 * time.Millisecond) // polling an eventually-consistent status, not synchronising goroutines
	}
}

// gatedStore holds the next Update after arm() until release is closed: it
// stands for a token store slower than the memory one (SQLite), so that the
// order "close recorded, then in-flight calls answered" is observable.
type gatedStore struct {
	tokens.Store
	armed   chan struct{} // closed by arm
	blocked chan struct{} // closed when the gated Update has started
	release chan struct{}
	once    sync.Once
}

func newGatedStore(s tokens.Store) *gatedStore {
	return &gatedStore{Store: s, armed: make(chan struct{}), blocked: make(chan struct{}), release: make(chan struct{})}
}

func (g *gatedStore) arm() { close(g.armed) }

func (g *gatedStore) Update(ctx context.Context, tid string, fn func(*tokens.Record) error) (tokens.Record, error) {
	select {
	case <-g.armed:
		first := false
		g.once.Do(func() { first = true })
		if first {
			close(g.blocked)
			<-g.release
		}
	default:
	}
	return g.Store.Update(ctx, tid, fn)
}

func TestTabDropsMidCall(t *testing.T) {
	t.Parallel()
	var gs *gatedStore
	e := newEnv(t, func(c *envCfg) {
		c.tok.Grace = time.Minute
		c.wrapStore = func(s tokens.Store) tokens.Store { gs = newGatedStore(s); return gs }
	})
	entered := make(chan struct{})
	block := make(chan struct{})
	defer close(block)
	token, _, tab := e.paired(lapdtest.WithHandler("list_actions", func(json.RawMessage) (any, *lapdtest.RPCError) {
		close(entered)
		<-block
		return nil, nil
	}))
	done := make(chan resp, 1)
	go func() { done <- e.lapCall(token, "/actions", "") }()
	<-entered
	gs.arm() // the next token write is the registry recording the close
	tab.Kill()
	<-gs.blocked
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(gs.release) }) }
	defer release()
	// While the close is being recorded the call must not be answered. No
	// signal exists for "nothing happened", so this waits a bounded time for
	// the answer that must not come (the old code answered at once here).
	select {
	case r := <-done:
		t.Fatalf("answered before the close was recorded: %d %v %s", r.status, r.header, r.body)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	r := <-done
	if r.status != 503 || r.code() != "paused" || r.header.Get("X-LLui-Reconnect") != "pending" || r.header.Get("Retry-After") == "" {
		t.Errorf("dropped mid-call: %d %v %s", r.status, r.header, r.body)
	}
	// The answer is computed after the close is recorded: the grace window
	// (a minute) is left, as for a call that arrives after the drop, not the
	// 5 s of a tab that is merely not connected.
	if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra <= 50 || !strings.Contains(string(r.body), fmt.Sprintf("may reconnect within %d s", ra)) {
		t.Errorf("dropped mid-call: Retry-After %q, want the grace left (about 60); body %s", r.header.Get("Retry-After"), r.body)
	}
}

func TestRPCTimeoutAndError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.pair.RPCTimeout = 100 * time.Millisecond })
	block := make(chan struct{})
	defer close(block)
	token, _, _ := e.paired(
		lapdtest.WithHandler("describe_context", func(json.RawMessage) (any, *lapdtest.RPCError) { <-block; return nil, nil }),
		lapdtest.WithHandler("describe_visible_content", func(json.RawMessage) (any, *lapdtest.RPCError) {
			return nil, &lapdtest.RPCError{Code: "invalid", Detail: "no DOM here"}
		}),
	)
	if r := e.lapCall(token, "/context", ""); r.status != 504 || r.code() != "timeout" {
		t.Errorf("timeout: %d %s", r.status, r.body)
	}
	r := e.lapCall(token, "/describe-visible", "")
	if r.status != 500 || r.code() != "invalid" || !strings.Contains(string(r.body), "no DOM here") {
		t.Errorf("rpc-error: %d %s", r.status, r.body)
	}
}

func TestActivationOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid, tab := e.paired()
	for range 3 {
		if r := e.lapCall(token, "/actions", ""); r.status != 200 {
			t.Fatal(r.status)
		}
	}
	if _, err := tab.WaitFor(ctxT(t), "active"); err != nil {
		t.Fatal(err)
	}
	// a later frame proves no second active was queued before it
	if r := e.lapCall(token, "/narrate", `{"text":"x"}`); r.status != 200 {
		t.Fatal(r.status)
	}
	if _, err := tab.WaitFor(ctxT(t), "log-push"); err != nil {
		t.Fatal(err)
	}
	if n := tab.Count("active"); n != 1 {
		t.Errorf("active pushed %d times", n)
	}
	rec, _ := e.tm.Get(ctxT(t), tid)
	if rec.Status != tokens.StatusActive {
		t.Errorf("status %s", rec.Status)
	}
}

func TestNarrateAndRecent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, tab := e.paired()
	if r := e.lapCall(token, "/narrate", `{"text":"hello","intent":"Greeting"}`); r.status != 200 {
		t.Fatal(r.status)
	}
	f, err := tab.WaitFor(ctxT(t), "log-push")
	if err != nil {
		t.Fatal(err)
	}
	var lp struct {
		Entry struct {
			ID, Kind, Intent, Detail string
			At                       int64
		}
	}
	_ = f.Decode(&lp)
	if !strings.HasPrefix(lp.Entry.ID, "narrate-") || lp.Entry.Kind != "narrate" || lp.Entry.Intent != "Greeting" || lp.Entry.Detail != "hello" || lp.Entry.At == 0 {
		t.Errorf("log-push entry %+v", lp.Entry)
	}
	// the tab echoes it as log-append; recent-actions shows it eventually
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := e.lapCall(token, "/recent-actions", `{"kind":"narrate"}`)
		if strings.Contains(string(r.body), "hello") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recent-actions: %s", r.body)
		}
		time.Sleep(10 * time.Millisecond) // polling for the echo
	}
}

func TestWaitChanged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, _, tab := e.paired()
	done := make(chan resp, 1)
	go func() { done <- e.lapCall(token, "/wait", `{"path":"/count","timeoutMs":10000}`) }()
	if _, err := tab.WaitFor(ctxT(t), "watch"); err != nil {
		t.Fatal(err)
	}
	_ = tab.SetState(map[string]any{"count": 7, "todos": []any{}})
	r := <-done
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"changed"`) || !strings.Contains(string(r.body), `"count":7`) {
		t.Errorf("wait: %d %s", r.status, r.body)
	}
}

// TestOneAuditEntryPerCall: a LAP call is audited once — by its route —
// although the tab logs every rpc it answers (and echoes narrations) with a
// log-append; those entries only feed /recent-actions. A log-append the
// server did not cause is still audited, as client-log.
func TestOneAuditEntryPerCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	token, tid, tab := e.paired()
	for _, c := range []struct{ route, body string }{{"/observe", ""}, {"/state", `{"path":"/count"}`}, {"/narrate", `{"text":"hi"}`}} {
		if r := e.lapCall(token, c.route, c.body); r.status != 200 {
			t.Fatalf("%s: %d %s", c.route, r.status, r.body)
		}
	}
	if err := tab.Send(ctxT(t), map[string]any{"t": "log-append", "entry": map[string]any{"id": "made-up", "kind": "read", "intent": "the tab's own"}}); err != nil {
		t.Fatal(err)
	}
	// The ring receives the tab's four log entries (the server has no
	// signal for "frame handled" other than the ring itself).
	deadline := time.Now().Add(10 * time.Second)
	for len(e.reg.RecentLog(tid, 0, "")) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("ring holds %d entries, want 4", len(e.reg.RecentLog(tid, 0, "")))
		}
		time.Sleep(5 * time.Millisecond) // polling for a state lapd does not signal
	}
	var routes, client []string
	for _, en := range e.sink.events(audit.EventLapCall) {
		if en.Detail["source"] == "client-log" {
			client = append(client, en.Detail["intent"].(string))
		} else {
			tool, _ := en.Detail["tool"].(string)
			routes = append(routes, tool)
		}
	}
	if strings.Join(routes, ",") != "observe,get_state,narrate" {
		t.Errorf("route entries %v, want one per call", routes)
	}
	if strings.Join(client, ",") != "the tab's own" {
		t.Errorf("client-log entries %v, want only the unsolicited one", client)
	}
}

// TestClientLogPooled (review M3): 1,000 tabs each sending unsolicited
// log-appends with 1,100-character fields grew the audit by ~6 MB/s, since
// each tab had its own budget (10 entries, then 1/s). Now every tab's
// client-log entries also share one budget (here 30 entries, no refill
// during the test), the rest become one summary for all tabs, and each
// field is cut to MaxClientLogField bytes. Scaled down: 40 tabs × 15.
func TestClientLogPooled(t *testing.T) {
	t.Parallel()
	const tabs, each, pool = 40, 15, 30
	e := newEnv(t, func(c *envCfg) {
		c.lap.MintBurst = 2 * tabs
		c.audit.PoolBurst, c.audit.PoolEvery = pool, time.Hour
	})
	long := strings.Repeat("k", 1100)
	var ts []*lapdtest.Tab
	for range tabs {
		_, _, tab := e.paired()
		ts = append(ts, tab)
	}
	for i, tab := range ts {
		for j := range each {
			if err := tab.Send(ctxT(t), map[string]any{"t": "log-append", "entry": map[string]any{
				"id": fmt.Sprint("own-", i, "-", j), "kind": long, "variant": long, "intent": long}}); err != nil {
				t.Fatal(err)
			}
		}
		// A socket's frames are handled in order: its pong follows
		// the handling of its log-appends.
		if err := tab.Send(ctxT(t), map[string]any{"t": "ping"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tab := range ts {
		if _, err := tab.WaitFor(ctxT(t), "pong"); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.sink.log.Close(); err != nil { // ends the window: the summary is written
		t.Fatal(err)
	}
	var single, summaries, total int64
	for _, en := range e.sink.events(audit.EventLapCall) {
		if en.Detail["source"] != "client-log" {
			continue
		}
		for _, k := range []string{"kind", "variant", "intent"} {
			if v, _ := en.Detail[k].(string); len(v) > lap.MaxClientLogField {
				t.Fatalf("%s of %d bytes, want at most %d", k, len(v), lap.MaxClientLogField)
			}
		}
		if n, ok := en.Detail["aggregated"].(int64); ok {
			if en.Detail["budget"] != lap.ClientLogPool {
				t.Errorf("summary for budget %v, want the pool %q", en.Detail["budget"], lap.ClientLogPool)
			}
			summaries++
			total += n
			continue
		}
		single++
		total++
	}
	if single != pool || summaries != 1 || total != tabs*each {
		t.Errorf("%d client-log entries and %d summaries accounting for %d, want %d, 1 and %d", single, summaries, total, pool, tabs*each)
	}
}

// TestRefusalFloodAggregated: refusals are audited per client within a
// budget; the rest of a flood is one entry with its count, not one write
// per request (issue: ~1,700 unauthenticated refusals/s wrote 62 MB of WAL
// in 5 s).
func TestRefusalFloodAggregated(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	start := time.Now()
	for range 200 {
		if r := e.lapCall("agt_not-a-real-token", "/observe", ""); r.status != 401 {
			t.Fatalf("status %d", r.status)
		}
	}
	if err := e.sink.log.Close(); err != nil { // ends the window
		t.Fatal(err)
	}
	var single, total int64
	for _, en := range e.sink.events(audit.EventAuthFailed) {
		if n, ok := en.Detail["aggregated"].(int64); ok {
			total += n
			continue
		}
		single++
		total++
	}
	// The budget refills at one entry per second.
	most := int64(audit.DefaultLimitBurst) + int64(time.Since(start)/time.Second) + 1
	if single < audit.DefaultLimitBurst || single > most || total != 200 {
		t.Errorf("%d single entries and %d refusals accounted for, want %d–%d and 200", single, total, audit.DefaultLimitBurst, most)
	}
}

// TestWaitEndsWithAdvice: a /wait whose tab drops, or whose session is
// revoked, answers 503 paused (lapd's documented difference from the
// reference's 200 timeout) with a detail that tells a bridge showing only
// code and detail what to do.
func TestWaitEndsWithAdvice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *envCfg) { c.tok.Grace = time.Minute })
	for _, how := range []string{"tab drops", "revoked"} {
		token, tid, tab := e.paired()
		done := make(chan resp, 1)
		go func() { done <- e.lapCall(token, "/wait", `{"path":"/count","timeoutMs":10000}`) }()
		if _, err := tab.WaitFor(ctxT(t), "watch"); err != nil {
			t.Fatal(err)
		}
		want := "retry in a few seconds"
		if how == "revoked" {
			if r := e.do("POST", "/agent/revoke", "", `{"tid":"`+tid+`","token":"`+token+`"}`); r.status != 200 {
				t.Fatalf("revoke: %d %s", r.status, r.body)
			}
			want = "new connect line"
		} else {
			tab.Kill()
		}
		r := <-done
		if r.status != 503 || r.code() != "paused" || !strings.Contains(string(r.body), want) {
			t.Errorf("%s mid-wait: %d %v %s, want 503 paused saying %q", how, r.status, r.header, r.body, want)
		}
	}
}
