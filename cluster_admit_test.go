package lapd_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/lapdtest"
)

// limitedPair starts node A, whose per-tid LAP rate limit is burst calls and
// then one an hour on a clock the test moves (advance), and node B, whose own
// limit would never refuse: a refusal of a call made on B can only come from
// A, where the tab lives. The tab pairs with A.
func limitedPair(t *testing.T, burst int) (a, b *lapdtest.Server, tab *lapdtest.Tab, token string, advance func(time.Duration)) {
	t.Helper()
	ns := natstest.Start(t)
	name := fmt.Sprintf("c%d", clusterN.Add(1))
	var skew atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	a = lapdtest.NewServer(lapd.Config{NATSConn: ns.Connect(t), ClusterName: name, NodeID: "a",
		LAPRate: rate.Every(time.Hour), LAPBurst: burst, Clock: clock})
	t.Cleanup(a.Close)
	b = lapdtest.NewServer(lapd.Config{NATSConn: ns.Connect(t), ClusterName: name, NodeID: "b", LAPRate: 1e9, LAPBurst: 1e9})
	t.Cleanup(b.Close)
	tab, sess, err := a.Pair(ctxT(t), lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tab.Close() })
	return a, b, tab, sess.Token, func(d time.Duration) { skew.Add(int64(d)) }
}

func forwarded(s *lapdtest.Server) int64 { return s.Lapd.Stats().Pairing.Cluster.Forwarded }

// A steady stream of calls made on B for a tab on A costs one round trip
// each (on the peer link by default; by NATS without it): the admit (paired? + A's rate limit) travels with the call
// instead of before it. BenchmarkClusterObserve reports the exact hops/op;
// here a stall of over a second on a loaded machine may cost a call an
// extra admit, so the bound is looser than the 2 hops per call of asking
// first.
func TestClusterOneHopPerCall(t *testing.T) {
	t.Parallel()
	ns := nodes(t, 2)
	a, b := ns[0], ns[1]
	tab, sess, err := a.Pair(ctxT(t), lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	lapB := b.LAPURL()
	if st, _, body := post(t, lapB+"/observe", sess.Token, `{}`); st != 200 || body["state"] == nil {
		t.Fatalf("first observe via B = %d %v", st, body)
	}
	const n = 7 // 1 + 4n calls stay within the default per-tid burst (30)
	// A narration's log-push reaches the tab after the answer: counted
	// by the hops only.
	rpcs := func() int { return tab.RPCCount("observe") + tab.RPCCount("get_state") + tab.RPCCount("send_message") }
	for _, route := range []string{"/observe", "/state", "/message", "/narrate"} {
		before, was := forwarded(b), rpcs()
		for range n {
			if st, _, body := post(t, lapB+route, sess.Token, `{"msg":{"type":"inc"},"text":"hello"}`); st != 200 {
				t.Fatalf("%s via B = %d %v", route, st, body)
			}
		}
		hops := forwarded(b) - before
		if hops > n*3/2 {
			t.Errorf("%d %s calls via B made %d forwarded requests, want about %d (one each)", n, route, hops, n)
		}
		if got := rpcs() - was; got != n && route != "/narrate" {
			t.Errorf("the tab answered %d rpcs for %d %s calls: a call was doubled or lost", got, n, route)
		}
		t.Logf("%s: %d calls, %d forwarded requests", route, n, hops)
	}
}

// The per-tid rate limit is A's even for calls made on B, whether the admit
// travels with the call (/observe, /state), is settled after a route that
// needed no call (/describe), or is asked first (/message): 429 with
// retryAfterMs and Retry-After, audited as rate-limited, and nothing
// reaches the tab.
func TestClusterRateLimitOnTabsNode(t *testing.T) {
	t.Parallel()
	const burst = 3
	a, b, tab, token, advance := limitedPair(t, burst)
	lapB := b.LAPURL()
	for i := range burst {
		if st, _, body := post(t, lapB+"/observe", token, `{}`); st != 200 {
			t.Fatalf("observe %d via B = %d %v, want 200 within A's burst", i, st, body)
		}
	}
	if n := tab.RPCCount("observe"); n != burst {
		t.Fatalf("tab answered %d observes, want %d", n, burst)
	}
	for _, route := range []string{"/observe", "/state", "/describe", "/message", "/narrate"} {
		before := forwarded(b)
		st, hdr, body := post(t, lapB+route, token, `{"msg":{"type":"inc"},"text":"hi"}`)
		e, _ := body["error"].(map[string]any)
		if st != http.StatusTooManyRequests || e["code"] != "rate-limited" {
			t.Fatalf("%s via B over A's limit = %d %v, want 429 rate-limited", route, st, body)
		}
		if ms, _ := e["retryAfterMs"].(float64); ms < 1000 || hdr.Get("Retry-After") == "" {
			t.Fatalf("%s via B: retryAfterMs %v, Retry-After %q: want A's wait (an hour a call)", route, e["retryAfterMs"], hdr.Get("Retry-After"))
		}
		t.Logf("%s refused after %d NATS requests", route, forwarded(b)-before)
	}
	if n, m := tab.RPCCount("observe"), tab.RPCCount("get_state")+tab.RPCCount("send_message"); n != burst || m != 0 {
		t.Fatalf("the tab saw %d observes and %d other calls: a refused call reached it", n, m)
	}
	// One bucket for the tab, wherever the call arrives.
	if st, _, _ := post(t, a.LAPURL()+"/observe", token, `{}`); st != http.StatusTooManyRequests {
		t.Fatalf("observe via A = %d, want 429 (the same bucket)", st)
	}
	// The refusal is audited where the call arrived, as on one node.
	if _, err := b.WaitAudit(ctxT(t), func(e audit.Entry) bool {
		return e.Event == audit.EventRateLimited && e.Detail["endpoint"] == "/agent/lap/v1/observe"
	}); err != nil {
		t.Fatalf("no rate-limited audit entry on B: %v", err)
	}
	advance(time.Hour)
	if st, _, body := post(t, lapB+"/observe", token, `{}`); st != 200 {
		t.Fatalf("observe via B once A's bucket refilled = %d %v", st, body)
	}
}

// A /message refused by the tab's rate limit has no effect: no frame to
// the tab, no approval proposed, no idempotency key kept (the same key
// dispatches once the limit allows), no outcome audited.
func TestClusterRefusedMessageHasNoEffect(t *testing.T) {
	t.Parallel()
	const burst = 2
	_, b, tab, token, advance := limitedPair(t, burst)
	lapB := b.LAPURL()
	for range burst {
		if st, _, body := post(t, lapB+"/observe", token, `{}`); st != 200 {
			t.Fatalf("observe via B = %d %v", st, body)
		}
	}
	for _, c := range []struct{ route, body string }{
		{"/message", `{"msg":{"type":"clearAll"},"idempotencyKey":"k-confirm","approvalTimeoutMs":0}`},
		{"/message", `{"msg":{"type":"inc"},"idempotencyKey":"k-inc"}`},
		{"/message", `{"msg":{"type":"inc"}}`},          // the admit travels with the call
		{"/message", `{"msg":{"type":"reset"}}`},        // lapd's policy refuses it: settled before the audit
		{"/message", `{"msg":{"type":"clearAll"}}`},     // would propose an approval
		{"/would-dispatch", `{"msg":{"type":"reset"}}`}, // a rejection, not an error
		{"/would-dispatch", `{"msg":{"type":"inc"}}`},   // asks the tab
		{"/narrate", `{"text":"refused"}`},              // would push a log-push
	} {
		st, _, body := post(t, lapB+c.route, token, c.body)
		if e, _ := body["error"].(map[string]any); st != http.StatusTooManyRequests || e["retryAfterMs"] == nil {
			t.Fatalf("%s %s via B over the limit = %d %v, want 429 with retryAfterMs", c.route, c.body, st, body)
		}
	}
	if n := tab.RPCCount("would_dispatch"); n != 0 {
		t.Fatalf("the tab received %d would_dispatch frames for refused calls", n)
	}
	if n := tab.RPCCount("send_message"); n != 0 {
		t.Fatalf("the tab received %d send_message frames for refused calls", n)
	}
	if ls := b.Lapd.LAP().Stats(); ls.IdemKeys != 0 {
		t.Fatalf("B kept %d idempotency keys for refused calls", ls.IdemKeys)
	}
	advance(time.Hour)
	st, _, body := post(t, lapB+"/message", token, `{"msg":{"type":"inc"},"idempotencyKey":"k-inc"}`)
	if st != 200 || body["status"] != "dispatched" {
		t.Fatalf("the refused key, once allowed = %d %v, want dispatched", st, body)
	}
	if n := tab.RPCCount("send_message"); n != 1 {
		t.Fatalf("the tab received %d send_message frames, want 1", n)
	}
	// Frames arrive in order: a refused narration's would have come first.
	if n := tab.Count("log-push"); n != 0 {
		t.Fatalf("the tab received %d log-push frames for a refused narration", n)
	}
	// Audit entries are written in order, off the request path: once the
	// allowed call's entry is there, any entry of the refused ones is too.
	if _, err := b.WaitAudit(ctxT(t), func(e audit.Entry) bool { return e.Event == audit.EventMsgDispatched }); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range b.AuditEntries() {
		switch e.Event {
		case audit.EventMsgDispatched:
			n++
		case audit.EventMsgBlocked, audit.EventConfirmProposed:
			t.Fatalf("a refused call was audited as %s: %+v", e.Event, e)
		}
	}
	if n != 1 {
		t.Fatalf("%d msg-dispatched entries, want 1 (the allowed call)", n)
	}
}
