package pairing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/coder/websocket"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/tokens"
)

var clusterN atomic.Int64

// linkMode is how a test cluster's nodes forward: all by NATS, on the
// peer link in plain TCP, or on the peer link in TLS.
type linkMode int

const (
	viaNATS linkMode = iota
	viaPeer
	viaPeerTLS
)

func (m linkMode) String() string { return [...]string{"nats", "peer", "peer-tls"}[m] }

// bothLinks runs a cluster test in parallel with the peer link (forwarded
// requests go node to node once the owner is known; plain and TLS) and
// without (everything by NATS).
func bothLinks(t *testing.T, test func(t *testing.T, link linkMode)) {
	t.Parallel()
	for _, link := range []linkMode{viaPeer, viaPeerTLS, viaNATS} {
		t.Run(link.String(), func(t *testing.T) {
			t.Parallel()
			test(t, link)
		})
	}
}

// clusterEnvs starts n registries (nodes) on one in-process NATS server,
// sharing a token bucket, each with its own connection; with a peer link,
// each also listens for it on 127.0.0.1.
func clusterEnvs(t testing.TB, n int, link linkMode) []*env {
	t.Helper()
	ns := natstest.Start(t)
	name := fmt.Sprintf("p%d", clusterN.Add(1))
	var out []*env
	for i := range n {
		nc := ns.Connect(t)
		st, err := tokens.OpenNATS(t.Context(), nc, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		out = append(out, newEnv(t, func(c *Config, tc *tokens.Config) {
			tc.Store = st
			c.Cluster, c.ClusterPrefix, c.NodeID = nc, name, fmt.Sprint("n", i)
			switch link {
			case viaPeer:
				c.PeerListen = "127.0.0.1:0"
			case viaPeerTLS:
				c.PeerListen, c.PeerTLS = "127.0.0.1:0", "on"
			}
		}))
	}
	return out
}

// pairHeard pairs tok's tab on owner and returns once every node in others
// has handled owner's takeover for it. (A takeover handled after another
// node's first admit reply makes that node forget what the reply told it,
// when it has no link to owner: its next request admits again.)
func pairHeard(t *testing.T, owner *env, tok, tid string, others ...*env) *tab {
	t.Helper()
	heard := make(chan string, 16)
	f := func(tid string) { heard <- tid }
	for _, e := range others {
		e.reg.cl.testTakeover.Store(&f)
	}
	tb := owner.pair(tok)
	for range others {
		for recv(t, heard) != tid {
		}
	}
	for _, e := range others {
		e.reg.cl.testTakeover.Store(nil)
	}
	return tb
}

// answer makes tb answer the next rpc frame with result (or never, when
// result is "").
func (tb *tab) answerNext(result string) string {
	f := tb.expect("rpc")
	id := f["id"].(string)
	if result != "" {
		tb.send(map[string]any{"t": "rpc-reply", "id": id, "result": json.RawMessage(result)})
	}
	return id
}

func TestClusterCallForwarded(t *testing.T) { bothLinks(t, testClusterCallForwarded) }

func testClusterCallForwarded(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	tok, tid := a.mint("u")
	tb := a.pair(tok)

	paired, retry, err := b.reg.Admit(ctxT(t), tid)
	if !paired || retry != 0 || err != nil {
		t.Fatalf("B.Admit = %v %v %v, want paired", paired, retry, err)
	}
	done := make(chan error, 1)
	var res json.RawMessage
	go func() {
		var err error
		res, err = b.reg.Call(ctxT(t), tid, "get_state", map[string]any{"path": "/n"}, 0)
		done <- err
	}()
	tb.answerNext(`{"n":1}`)
	if err := recv(t, done); err != nil || string(res) != `{"n":1}` {
		t.Fatalf("Call via B = %s, %v", res, err)
	}
	// The caller's request id travels with the forwarded call.
	go func() {
		_, err := b.reg.Call(audit.WithRequestID(ctxT(t), "rid-7"), tid, "get_state", nil, 0)
		done <- err
	}()
	if f := tb.expect("rpc"); f["rid"] != "rid-7" {
		t.Fatalf("forwarded rpc frame %v, want rid rid-7", f)
	} else {
		tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": json.RawMessage(`{}`)})
	}
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	// The tab's rpc-error comes back as *RPCError, not in doubt.
	go func() {
		_, err := b.reg.Call(ctxT(t), tid, "x", nil, 0)
		done <- err
	}()
	f := tb.expect("rpc")
	tb.send(map[string]any{"t": "rpc-error", "id": f["id"], "code": "invalid", "detail": "no"})
	var re *RPCError
	if err := recv(t, done); !errors.As(err, &re) || re.Code != "invalid" || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("rpc-error via B = %v", err)
	}
	// A tab that never answers: ErrTimeout, in doubt, answered once.
	go func() {
		_, err := b.reg.Call(ctxT(t), tid, "slow", nil, 300*time.Millisecond)
		done <- err
	}()
	tb.answerNext("")
	if err := recv(t, done); !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("unanswered call via B = %v, want ErrTimeout in doubt", err)
	}
	// Push, Hello and RecentLog reach the owner.
	if err := b.reg.Push(tid, map[string]any{"t": "log-push", "entry": map[string]any{"kind": "narrate"}}); err != nil {
		t.Fatal(err)
	}
	tb.expect("log-push")
	if st := b.reg.Stats().Cluster; st.Forwarded == 0 || a.reg.Stats().Cluster.Served == 0 {
		t.Fatalf("stats: B %+v, A %+v", st, a.reg.Stats().Cluster)
	}
	// With the link, everything after the first admit went node to node.
	if st := b.reg.Stats().Cluster; link != viaNATS && (st.Direct < 5 || st.Fallbacks != 0) || link == viaNATS && st.Direct != 0 {
		t.Fatalf("link %v: B's stats %+v", link, st)
	}
}

// No node holds the tab: paused at once, and not in doubt (nothing left).
func TestClusterNoResponders(t *testing.T) { bothLinks(t, testClusterNoResponders) }

func testClusterNoResponders(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	_, tid := es[0].mint("u")
	start := time.Now()
	_, err := es[1].reg.Call(ctxT(t), tid, "get_state", nil, 0)
	if !errors.Is(err, ErrPaused) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Call for an unpaired tid = %v, want ErrPaused, not in doubt", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v: no responders should answer at once", d)
	}
	if paired, _, err := es[1].reg.Admit(ctxT(t), tid); paired || err != nil {
		t.Fatalf("Admit = %v, %v", paired, err)
	}
	if es[1].reg.Stats().Cluster.NoResponders == 0 {
		t.Fatal("no-responders not counted")
	}
}

// A tab's node subscribes to its subjects on its own NATS server before
// the tab's hello-ack; the other servers of a NATS cluster learn of it a
// moment later. A call made on another node, through another server, in
// that moment found no node and was answered paused for a tab that had
// just paired (TestClusterJetStreamReplicas, once). Nobody received it, so
// it is looked for again. Here the tab pairs while the caller's first look
// has found nobody (the hook holds the caller until it has).
func TestClusterLateSubscriptionFound(t *testing.T) {
	t.Parallel()
	es := clusterEnvs(t, 2, viaNATS)
	token, tid := es[0].mint("u")
	looked, paired := make(chan struct{}, 3), make(chan struct{})
	es[1].reg.cl.testNoResponders = func() {
		looked <- struct{}{}
		<-paired
	}
	res := make(chan error, 1)
	go func() {
		_, err := es[1].reg.Call(ctxT(t), tid, "get_state", nil, 0)
		res <- err
	}()
	recv(t, looked) // the first look found no node
	tb := es[0].pair(token)
	close(paired)
	tb.answerNext(`{"n":1}`)
	if err := recv(t, res); err != nil {
		t.Fatalf("Call made as the tab paired on another node = %v, want its answer", err)
	}
}

// The looks again cost a closed tab's caller two more NATS requests and
// 120 ms, once per tid per second: a token holder calling a tab that no
// node holds, in a loop, makes one NATS request per call, not three.
func TestClusterAbsentTabLookedForOnce(t *testing.T) {
	t.Parallel()
	es := clusterEnvs(t, 2, viaNATS)
	_, tid := es[0].mint("u")
	var looks atomic.Int64
	es[1].reg.cl.testNoResponders = func() { looks.Add(1) }
	for i, want := range []int64{2, 2, 2} {
		if _, err := es[1].reg.Call(ctxT(t), tid, "get_state", nil, 0); !errors.Is(err, ErrPaused) {
			t.Fatalf("call %d for a tab no node holds = %v, want ErrPaused", i+1, err)
		}
		if n := looks.Load(); n != want {
			t.Fatalf("after call %d: %d looks again, want %d (only the first call within a second looks again)", i+1, n, want)
		}
	}
}

// The per-tid rate limit is decided by the owner's OnAdmit.
func TestClusterAdmitOnOwner(t *testing.T) { bothLinks(t, testClusterAdmitOnOwner) }

func testClusterAdmitOnOwner(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	var asked atomic.Int32
	h := *a.reg.hooks.Load()
	h.OnAdmit = func(string) (bool, int64) { asked.Add(1); return false, 1500 }
	a.reg.SetHooks(h)
	tok, tid := a.mint("u")
	a.pair(tok)
	paired, retry, err := b.reg.Admit(ctxT(t), tid)
	if !paired || retry != 1500 || err != nil || asked.Load() != 1 {
		t.Fatalf("Admit via B = %v %v %v (owner asked %d times)", paired, retry, err, asked.Load())
	}
}

// recordEchoes reports, for each log-append e's registry receives, whether
// it was an expected echo.
func recordEchoes(e *env) chan bool {
	echoes := make(chan bool, 2)
	h := *e.reg.hooks.Load()
	h.OnLogAppend = func(_ string, _ json.RawMessage, echo bool) { echoes <- echo }
	e.reg.SetHooks(h)
	return echoes
}

// ExpectLog on a node without the tab reaches the owner, where the tab's
// echo arrives: the echo is reported as expected (not a client log entry).
func TestClusterExpectLogOnOwner(t *testing.T) { bothLinks(t, testClusterExpectLogOnOwner) }

func testClusterExpectLogOnOwner(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	echoes := recordEchoes(a)
	tok, tid := a.mint("u")
	tb := a.pair(tok)
	b.reg.ExpectLog(tid, "narr-1")
	tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": "narr-1", "kind": "narrate"}})
	if echo := recv(t, echoes); !echo {
		t.Fatal("the echo of an id expected via B was not recognised on A")
	}
	tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": "other", "kind": "read"}})
	if echo := recv(t, echoes); echo {
		t.Fatal("an unexpected id was reported as an echo")
	}
}

// PushLog on a node without the tab is one request that carries the
// gate's deferred admit: the tab gets the log-push and its echo is
// recognised on the owner; refused by the owner's rate limit, nothing is
// pushed and nothing is expected.
func TestClusterPushLog(t *testing.T) { bothLinks(t, testClusterPushLog) }

func testClusterPushLog(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	echoes := recordEchoes(a)
	asked, refuse := countAdmits(a, 900)
	tok, tid := a.mint("u")
	tb := pairHeard(t, a, tok, tid, b)
	if paired, _, err := b.reg.Admit(ctxT(t), tid); !paired || err != nil {
		t.Fatalf("Admit via B = %v %v", paired, err)
	}
	asked.Store(0)
	ctx, ok := b.reg.DeferAdmit(ctxT(t), tid)
	if !ok {
		t.Fatal("DeferAdmit right after an admit: not trusted")
	}
	before := b.reg.Stats().Cluster.Forwarded
	entry := map[string]any{"id": "narr-1", "kind": "narrate"}
	if err := b.reg.PushLog(ctx, tid, "narr-1", map[string]any{"t": "log-push", "entry": entry}); err != nil {
		t.Fatal(err)
	}
	if got := tb.expect("log-push"); got["entry"].(map[string]any)["id"] != "narr-1" {
		t.Fatalf("the tab got %v", got)
	}
	if hops, n := b.reg.Stats().Cluster.Forwarded-before, asked.Load(); hops != 1 || n != 1 {
		t.Fatalf("PushLog made %d requests and ran OnAdmit %d times; want 1 and 1", hops, n)
	}
	if paired, _, err := b.reg.SettleAdmit(ctx, tid); !paired || err != nil || b.reg.Stats().Cluster.Forwarded-before != 1 {
		t.Fatal("the admit PushLog carried was settled again")
	}
	tb.send(map[string]any{"t": "log-append", "entry": entry})
	if echo := recv(t, echoes); !echo {
		t.Fatal("the echo of an entry pushed via B was not recognised on A")
	}

	refuse.Store(true)
	ctx, ok = b.reg.DeferAdmit(ctxT(t), tid)
	if !ok {
		t.Fatal("the reply to a request that carried the admit did not keep the tab fresh")
	}
	err := b.reg.PushLog(ctx, tid, "narr-2", map[string]any{"t": "log-push", "entry": map[string]any{"id": "narr-2"}})
	var rl *RateLimitError
	if !errors.As(err, &rl) || rl.RetryAfterMs != 900 {
		t.Fatalf("PushLog refused by the owner = %v, want *RateLimitError 900 ms", err)
	}
	if err := b.reg.Push(tid, map[string]any{"t": "marker"}); err != nil {
		t.Fatal(err)
	}
	tb.expect("marker") // the refused log-push never reached the tab
	tb.send(map[string]any{"t": "log-append", "entry": map[string]any{"id": "narr-2", "kind": "narrate"}})
	if echo := recv(t, echoes); echo {
		t.Fatal("the id of a refused PushLog was expected on A")
	}
}

// An owner that does not serve an op (an older lapd) is told apart from
// other failures, so a requester can fall back to the ops it serves.
func TestClusterUnknownOpReply(t *testing.T) {
	t.Parallel()
	if _, err := decodeReply(errReply(errors.New(unknownOp+`"logpush"`), false)); !errors.Is(err, errUnknownOp) {
		t.Fatalf("decoded %v, want errUnknownOp", err)
	}
	if _, err := decodeReply(errReply(errors.New("something else"), false)); errors.Is(err, errUnknownOp) {
		t.Fatal("another failure decoded as errUnknownOp")
	}
}

// PushLog to an owner that does not serve "logpush" (an older lapd, played
// here by a plain NATS responder) falls back to "expect" then "push".
func TestClusterPushLogToOlderNode(t *testing.T) {
	t.Parallel()
	b := clusterEnvs(t, 1, viaNATS)[0]
	const tid = "tid-on-an-older-node"
	ops := make(chan string, 4)
	sub, err := b.reg.cl.nc.Subscribe(b.reg.cl.subject(tid, "*"), func(m *nats.Msg) {
		op := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		ops <- op
		if op == "logpush" {
			_ = m.Respond(errReply(errors.New(unknownOp+`"logpush"`), false))
			return
		}
		_ = m.Respond(okReply(nil))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := b.reg.PushLog(ctxT(t), tid, "narr-1", map[string]any{"t": "log-push"}); err != nil {
		t.Fatalf("PushLog to an older node = %v", err)
	}
	for _, want := range []string{"logpush", "expect", "push"} {
		if got := recv(t, ops); got != want {
			t.Fatalf("request %q, want %q", got, want)
		}
	}
}

// A socket for the same tid on another node takes over: the old one is
// closed with 4002, its in-flight call fails paused (in doubt), the record
// stays the new owner's, and calls follow the tab.
func TestClusterTakeover(t *testing.T) { bothLinks(t, testClusterTakeover) }

func testClusterTakeover(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	tok, tid := a.mint("u")
	old := a.pair(tok)
	inflight := make(chan error, 1)
	go func() {
		_, err := a.reg.Call(ctxT(t), tid, "slow", nil, 10*time.Second)
		inflight <- err
	}()
	old.expect("rpc")

	nw := b.pair(tok)
	if st := recv(t, old.doneStatus()); st != CloseSuperseded {
		t.Fatalf("old socket closed with %d, want %d", st, CloseSuperseded)
	}
	if err := recv(t, inflight); !errors.Is(err, ErrPaused) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("in-flight call on the old node = %v, want paused in doubt", err)
	}
	rec, err := a.tm.Get(ctxT(t), tid)
	if err != nil || rec.Status == tokens.StatusPendingResume {
		t.Fatalf("record after takeover = %+v, %v: the old node marked it pending-resume", rec, err)
	}
	// A now forwards to B.
	done := make(chan error, 1)
	go func() {
		_, err := a.reg.Call(ctxT(t), tid, "get_state", nil, 0)
		done <- err
	}()
	nw.answerNext(`{}`)
	if err := recv(t, done); err != nil {
		t.Fatalf("Call via A after takeover = %v", err)
	}
}

// doneStatus reports the close code once tb's connection ends.
func (tb *tab) doneStatus() <-chan int {
	ch := make(chan int, 1)
	go func() {
		<-tb.done
		ch <- int(tb.closeStatus())
	}()
	return ch
}

// countAdmits installs e's OnAdmit: it counts its runs, and refuses (with
// retryMs) while refuse is set.
func countAdmits(e *env, retryMs int64) (asked *atomic.Int32, refuse *atomic.Bool) {
	asked, refuse = new(atomic.Int32), new(atomic.Bool)
	h := *e.reg.hooks.Load()
	h.OnAdmit = func(string) (bool, int64) {
		asked.Add(1)
		if refuse.Load() {
			return false, retryMs
		}
		return true, 0
	}
	e.reg.SetHooks(h)
	return asked, refuse
}

// A deferred admit travels with the request's first forwarded call: one
// round trip, OnAdmit run once on the owner before the tab sees anything;
// refused, the call fails with *RateLimitError (not in doubt) and the tab
// sees nothing. A request that made no call settles it with an admit.
func TestClusterDeferredAdmit(t *testing.T) { bothLinks(t, testClusterDeferredAdmit) }

func testClusterDeferredAdmit(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	asked, refuse := countAdmits(a, 1500)
	tok, tid := a.mint("u")
	tb := pairHeard(t, a, tok, tid, b)

	if _, ok := b.reg.DeferAdmit(ctxT(t), tid); ok {
		t.Fatal("DeferAdmit trusted a tab B never heard about")
	}
	if _, ok := a.reg.DeferAdmit(ctxT(t), tid); ok {
		t.Fatal("DeferAdmit on the tab's own node: Admit is local there")
	}
	if paired, _, err := b.reg.Admit(ctxT(t), tid); !paired || err != nil {
		t.Fatalf("Admit via B = %v %v", paired, err)
	}
	asked.Store(0)
	ctx, ok := b.reg.DeferAdmit(ctxT(t), tid)
	if !ok {
		t.Fatal("DeferAdmit right after an admit: not trusted")
	}
	before := b.reg.Stats().Cluster.Forwarded
	done := make(chan error, 1)
	for range 2 { // the second call of the same request carries no admit
		go func() {
			_, err := b.reg.Call(ctx, tid, "get_state", nil, 0)
			done <- err
		}()
		tb.answerNext(`{}`)
		if err := recv(t, done); err != nil {
			t.Fatal(err)
		}
	}
	if n, hops := asked.Load(), b.reg.Stats().Cluster.Forwarded-before; n != 1 || hops != 2 {
		t.Fatalf("two calls with one deferred admit: OnAdmit ran %d times, %d requests; want 1 and 2", n, hops)
	}
	if paired, retry, err := b.reg.SettleAdmit(ctx, tid); !paired || retry != 0 || err != nil || b.reg.Stats().Cluster.Forwarded-before != 2 {
		t.Fatalf("SettleAdmit after the admit travelled = %v %v %v (a request was made)", paired, retry, err)
	}

	refuse.Store(true)
	ctx, ok = b.reg.DeferAdmit(ctxT(t), tid)
	if !ok {
		t.Fatal("the reply to a call that carried the admit did not keep the tab fresh")
	}
	_, err := b.reg.Call(ctx, tid, "get_state", nil, 0)
	var rl *RateLimitError
	if !errors.As(err, &rl) || rl.RetryAfterMs != 1500 || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Call refused by the owner = %v, want *RateLimitError 1500 ms, not in doubt", err)
	}
	// Nothing reached the tab: the next frame it gets is this push.
	if err := b.reg.Push(tid, map[string]any{"t": "log-push"}); err != nil {
		t.Fatal(err)
	}
	tb.expect("log-push")

	// Settled without a call: one admit round trip, refused.
	ctx, _ = b.reg.DeferAdmit(ctxT(t), tid)
	asked.Store(0)
	if paired, retry, err := b.reg.SettleAdmit(ctx, tid); !paired || retry != 1500 || err != nil || asked.Load() != 1 {
		t.Fatalf("SettleAdmit without a call = %v %v %v (owner asked %d times)", paired, retry, err, asked.Load())
	}
}

// An owner that takes an admit and never answers (it stopped in between)
// does not leave the gate waiting for ever when the caller's context has
// no deadline, as an HTTP request's has not: the admit fails after
// admitTimeout, and the gate answers paused.
func TestClusterAdmitBounded(t *testing.T) { bothLinks(t, testClusterAdmitBounded) }

func testClusterAdmitBounded(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	_, tid := a.mint("u")
	sub, err := a.reg.cl.nc.QueueSubscribe(a.reg.cl.subject(tid, "*"), "owner", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := a.reg.cl.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := b.reg.Admit(context.Background(), tid)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Admit of a tab whose owner never answers = %v, want the admit's deadline", err)
		}
	case <-time.After(admitTimeout + 10*time.Second):
		t.Fatal("Admit is still waiting for an owner that never answers")
	}
}

// The owner lends its reply buffers from a pool: a short answer after a
// long one (and with the admit's headers, or without) comes back exactly.
func TestClusterRepliesReuseBuffers(t *testing.T) { bothLinks(t, testClusterRepliesReuseBuffers) }

func testClusterRepliesReuseBuffers(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	tok, tid := a.mint("u")
	tb := pairHeard(t, a, tok, tid, b)
	if paired, _, err := b.reg.Admit(ctxT(t), tid); !paired || err != nil {
		t.Fatalf("Admit via B = %v %v", paired, err)
	}
	long := `{"s":"` + strings.Repeat("x", 20<<10) + `"}`
	for i, want := range []string{long, `{"n":1}`, long, `[2]`, `{}`} {
		ctx := ctxT(t)
		if i%2 == 1 {
			dctx, ok := b.reg.DeferAdmit(ctx, tid)
			if !ok { // over a second since the last reply on a loaded machine
				if _, _, err := b.reg.Admit(ctx, tid); err != nil {
					t.Fatal(err)
				}
				dctx, ok = b.reg.DeferAdmit(ctx, tid)
			}
			if !ok {
				t.Fatal("DeferAdmit right after an admit: not fresh")
			}
			ctx = dctx
		}
		done := make(chan error, 1)
		var res json.RawMessage
		go func() {
			var err error
			res, err = b.reg.Call(ctx, tid, "get_state", nil, 0)
			done <- err
		}()
		tb.answerNext(want)
		if err := recv(t, done); err != nil || string(res) != want {
			t.Fatalf("call %d via B = %.40s… (%d bytes), %v; want %.40s… (%d bytes)", i, res, len(res), err, want, len(want))
		}
	}
}

// refresh decodes an owner's health header only when it changed, and keeps
// the generation and freshness moving either way.
func TestClusterRefreshHealth(t *testing.T) {
	c := &cluster{remote: map[string]*remoteTab{}}
	c.refresh("t", 3, []byte(`{"connected":true,"reconnects":1}`))
	c.refresh("t", 4, []byte(`{"connected":true,"reconnects":1}`))
	e := c.remote["t"]
	if e.gen != 4 || e.health.Reconnects != 1 || !e.health.Connected || !c.fresh("t") {
		t.Fatalf("after two equal headers: %+v", e)
	}
	c.refresh("t", 5, []byte(`{"connected":false,"reconnects":2}`))
	if e.gen != 5 || e.health.Reconnects != 2 || e.health.Connected {
		t.Fatalf("after a changed header: %+v", e)
	}
	at := e.at
	c.refresh("t", 6, []byte(`not json`))
	if e.gen != 5 || e.at != at || e.health.Reconnects != 2 {
		t.Fatalf("a bad header changed the entry: %+v", e)
	}
}

// The owner's workers outlive requests, but a call waiting for the tab
// never holds up another: both reach the tab before either is answered,
// on fresh workers and on idle ones alike.
func TestClusterConcurrentCallsOnWorkers(t *testing.T) {
	bothLinks(t, testClusterConcurrentCallsOnWorkers)
}

func testClusterConcurrentCallsOnWorkers(t *testing.T, link linkMode) {
	es := clusterEnvs(t, 2, link)
	a, b := es[0], es[1]
	tok, tid := a.mint("u")
	tb := a.pair(tok)
	if paired, _, err := b.reg.Admit(ctxT(t), tid); !paired || err != nil {
		t.Fatalf("Admit via B = %v %v", paired, err)
	}
	for round := range 3 {
		done := make(chan error, 2)
		res := make([]json.RawMessage, 2)
		for i := range 2 {
			go func() {
				var err error
				res[i], err = b.reg.Call(ctxT(t), tid, "get_state", map[string]any{"i": i}, 0)
				done <- err
			}()
		}
		f1, f2 := tb.expect("rpc"), tb.expect("rpc") // neither answered yet
		for _, f := range []map[string]any{f2, f1} {
			i := f["args"].(map[string]any)["i"].(float64)
			tb.send(map[string]any{"t": "rpc-reply", "id": f["id"], "result": json.RawMessage(fmt.Sprintf(`{"i":%v}`, i))})
		}
		for range 2 {
			if err := recv(t, done); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if string(res[0]) != `{"i":0}` || string(res[1]) != `{"i":1}` {
			t.Fatalf("round %d: results %s %s", round, res[0], res[1])
		}
	}
}

// A socket's end and a new socket's start reach the tid's subscription
// outside the session's lock, so either may come late; each decides from
// the session as it is then. A late unsubscribe while the session has a
// socket here again keeps the subscription (before, it left the node
// holding the tab unsubscribed, and other nodes answered paused for good:
// TestClusterSimultaneousConnects, about once in 500 loaded runs); a late
// subscribe for a socket that has ended does nothing.
func TestClusterLateOwnAndDisown(t *testing.T) {
	t.Parallel()
	es := clusterEnvs(t, 2, viaNATS)
	a, b := es[0], es[1]
	tok, tid := a.mint("u")
	tb := a.pair(tok)
	a.reg.mu.Lock()
	s := a.reg.sessions[tid]
	a.reg.mu.Unlock()
	x := s.socket()
	subscribed := func() bool {
		a.reg.cl.mu.Lock()
		defer a.reg.cl.mu.Unlock()
		_, ok := a.reg.cl.subs[tid]
		return ok
	}
	a.reg.cl.disown(tid, s) // an earlier socket's late end, while x holds the session
	if paired, _, err := b.reg.Admit(ctxT(t), tid); !paired || err != nil {
		t.Fatalf("B's admit after a late unsubscribe = %v %v: A no longer answers for the tab it holds", paired, err)
	}
	a.reg.cl.disown(tid, &session{tid: tid}) // another session's
	if !subscribed() {
		t.Fatal("another session's end unsubscribed this one's")
	}
	_ = tb.ws.Close(websocket.StatusNormalClosure, "")
	recv(t, a.closed)
	if subscribed() {
		t.Fatal("still subscribed after the tab's socket closed")
	}
	a.reg.cl.own(tid, x) // x's start, late
	if subscribed() {
		t.Fatal("a late subscribe for a socket that ended subscribed the node to a tab it does not hold")
	}
}
