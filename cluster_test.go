package lapd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/tokens"
)

var clusterN atomic.Int64

// nodes starts n lapd nodes on one in-process NATS server, each with its
// own NATS connection, as n processes would be.
func nodes(t *testing.T, n int) []*lapdtest.Server {
	t.Helper()
	_, _, out := nodesOn(t, n)
	return out
}

func nodesOn(t *testing.T, n int) (*natstest.Server, string, []*lapdtest.Server) {
	t.Helper()
	ns := natstest.Start(t)
	name := fmt.Sprintf("c%d", clusterN.Add(1))
	var out []*lapdtest.Server
	for i := range n {
		s := lapdtest.NewServer(lapd.Config{NATSConn: ns.Connect(t), ClusterName: name, NodeID: fmt.Sprint("n", i), Grace: 5 * time.Second, AuditNATS: true})
		t.Cleanup(s.Close)
		out = append(out, s)
	}
	return ns, name, out
}

// The tab on node A, every LAP call through node B.
func TestClusterCallsAcrossNodes(t *testing.T) {
	t.Parallel()
	nats, name, ns := nodesOn(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	tab, sess, err := a.Pair(ctx, lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	lapB := b.LAPURL()

	st, _, body := post(t, lapB+"/observe", sess.Token, `{}`)
	if st != 200 || body["state"] == nil {
		t.Fatalf("observe via B = %d %v", st, body)
	}
	st, _, body = post(t, lapB+"/message", sess.Token, `{"msg":{"type":"inc"},"idempotencyKey":"k1"}`)
	if st != 200 || body["status"] != "dispatched" {
		t.Fatalf("message via B = %d %v", st, body)
	}
	// The same key through A: the tab de-duplicates, nothing runs twice.
	st, _, body = post(t, a.LAPURL()+"/message", sess.Token, `{"msg":{"type":"inc"},"idempotencyKey":"k1"}`)
	if st != 200 || body["status"] != "dispatched" {
		t.Fatalf("retry via A = %d %v", st, body)
	}
	if n := tab.RPCCount("send_message"); n != 2 {
		t.Fatalf("tab saw %d send_message frames, want 2 (one per node, de-duplicated by the tab)", n)
	}
	if s := fmt.Sprint(tab.State()); s != "map[count:1 todos:[]]" {
		t.Fatalf("state = %s: the retried key ran twice", s)
	}

	// wait_for_change through B: the human changes the state on A's tab.
	done := make(chan map[string]any, 1)
	go func() {
		_, _, body := post(t, lapB+"/wait", sess.Token, `{"timeoutMs":10000}`)
		done <- body
	}()
	waitUntil(t, "the watch to reach the tab", func() bool { return tab.Watches() == 1 })
	if err := tab.SetState(map[string]any{"count": 7, "todos": []any{}}); err != nil {
		t.Fatal(err)
	}
	select {
	case body := <-done:
		if body["status"] != "changed" {
			t.Fatalf("wait via B = %v", body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait via B did not return")
	}

	// narrate through B reaches the tab on A.
	if st, _, body := post(t, lapB+"/narrate", sess.Token, `{"text":"hello from B"}`); st != 200 {
		t.Fatalf("narrate via B = %d %v", st, body)
	}
	if _, err := tab.WaitFor(ctx, "log-push"); err != nil {
		t.Fatal(err)
	}
	st, _, body = post(t, lapB+"/recent-actions", sess.Token, `{"n":5}`)
	if entries, _ := body["entries"].([]any); st != 200 || len(entries) == 0 {
		t.Fatalf("recent-actions via B = %d %v, want the ring kept on A", st, body)
	}
	if bs := b.Lapd.Stats().Pairing.Cluster; bs.Forwarded == 0 {
		t.Fatalf("B forwarded nothing: %+v", bs)
	}

	// The cluster's audit trail holds both nodes' entries: the mint and the
	// tab's claim recorded on A, the dispatch and the narration's lap-call
	// on B. The tab's echoes (of each rpc, and of the narration's log-push,
	// expected on A through ExpectLog) are not audited a second time as
	// client log entries.
	a.Close()
	b.Close()
	q, closer, err := lapd.OpenClusterAudit(ctx, nats.URL(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	es, err := q.Query(ctx, audit.Filter{TID: sess.TID})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range es {
		seen[e.Event] = true
		if e.Event == audit.EventLapCall && e.Detail["source"] == "client-log" {
			seen["client-log"] = true
		}
	}
	if !seen[audit.EventMsgDispatched] || !seen[audit.EventLapCall] || !seen[audit.EventClaim] || !seen[audit.EventMint] || seen["client-log"] {
		t.Fatalf("cluster audit for the session: %v", seen)
	}
}

// An approval proposed through B, answered in the tab on A, read on B;
// then the tab moves to B (takeover) and a pending one is re-delivered.
func TestClusterApprovalsAndTakeover(t *testing.T) {
	t.Parallel()
	ns := nodes(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	app := lapdtest.DemoApp()
	tab, sess, err := a.Pair(ctx, lapdtest.WithApp(app))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	res := make(chan map[string]any, 1)
	go func() {
		_, _, body := post(t, b.LAPURL()+"/message", sess.Token, `{"msg":{"type":"clearAll"},"timeoutMs":10000}`)
		res <- body
	}()
	id, err := tab.WaitConfirm(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Approve(ctx, tab, id); err != nil {
		t.Fatal(err)
	}
	if body := <-res; body["status"] != "confirmed" {
		t.Fatalf("message via B after approval on A's tab = %v", body)
	}

	// A second approval, left pending (approvalTimeoutMs 0).
	st, _, body := post(t, b.LAPURL()+"/message", sess.Token, `{"msg":{"type":"clearAll"},"approvalTimeoutMs":0}`)
	if st != 200 || body["status"] != "pending-confirmation" {
		t.Fatalf("message = %d %v", st, body)
	}
	pending := body["confirmId"].(string)

	// The tab reconnects to B: A closes its socket with 4002.
	tab2, err := lapdtest.Dial(ctx, b.WSURL(), sess.Token, lapdtest.WithTabSecret(sess.TabSecret), lapdtest.WithApp(app))
	if err != nil {
		t.Fatal(err)
	}
	defer tab2.Close()
	select {
	case <-tab.Done():
		if c := tab.CloseStatus(); c != 4002 {
			t.Fatalf("old socket closed with %d, want 4002 (superseded)", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the old node did not let go of the tab")
	}
	// B re-delivers the pending approval.
	f, err := tab2.WaitFor(ctx, "confirm-sync")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(f.Raw), pending) {
		t.Fatalf("confirm-sync = %s, want %s in it", f.Raw, pending)
	}
	// Calls through A now reach the tab on B.
	waitUntil(t, "A to route to B", func() bool {
		st, _, _ := post(t, a.LAPURL()+"/observe", sess.Token, `{}`)
		return st == 200
	})
	if err := tab2.Approve(ctx, pending); err != nil {
		t.Fatal(err)
	}
	st, _, body = post(t, a.LAPURL()+"/confirm-result", sess.Token, `{"confirmId":"`+pending+`","timeoutMs":5000}`)
	if st != 200 || body["status"] != "confirmed" {
		t.Fatalf("confirm-result via A = %d %v", st, body)
	}
	// The second socket left the record awaiting-claude (as the reference
	// does) and A's calls activate it; B's copy follows A's write through
	// the bucket's watch. A call reads A's replica of the record, which
	// on a loaded machine may not have B's write yet (then it activates
	// nothing): the next call does, as the model's next call would.
	waitUntil(t, "the record active on B", func() bool {
		post(t, a.LAPURL()+"/observe", sess.Token, `{}`) // (a 429 from the tab's rate limit does no harm here)
		rec, err := b.Lapd.Tokens().Get(ctx, sess.TID)
		if err == nil && rec.Status == "pending-resume" {
			t.Fatalf("record after takeover = %+v: the old node marked it pending-resume", rec)
		}
		return err == nil && rec.Status == "active"
	})
}

// The tab's node goes away: calls elsewhere answer paused, not an error,
// and the tab re-pairs with another node inside the grace window.
func TestClusterOwnerGone(t *testing.T) {
	t.Parallel()
	ns := nodes(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	tab, sess, err := a.Pair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	<-tab.Done()
	st, hdr, body := post(t, b.LAPURL()+"/observe", sess.Token, `{}`)
	if st != 503 || body["error"].(map[string]any)["code"] != "paused" || hdr.Get("Retry-After") == "" {
		t.Fatalf("observe via B with no node holding the tab = %d %v", st, body)
	}
	tab2, err := sess.Pair(context.WithoutCancel(ctx), lapdtest.WithApp(lapdtest.DemoApp()))
	if err == nil {
		tab2.Close()
		t.Fatal("dialled the closed node")
	}
	tab2, err = lapdtest.Dial(ctx, b.WSURL(), sess.Token, lapdtest.WithTabSecret(sess.TabSecret))
	if err != nil {
		t.Fatal(err)
	}
	defer tab2.Close()
	if st, _, body := post(t, b.LAPURL()+"/observe", sess.Token, `{}`); st != 200 {
		t.Fatalf("observe after re-pair = %d %v", st, body)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // state on another node: no signal to await
	}
}

// A modern MCP client (no MCP session) connects on node A and carries on
// with the handle on node B: bindings live in the cluster's bucket.
func TestClusterMCPHandleOnAnyNode(t *testing.T) {
	t.Parallel()
	ns := nodes(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	tab, sess, err := a.Pair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	ca, cb := mcpModern(t, a.MCPURL()), mcpModern(t, b.MCPURL())
	res := mcpCallTool(t, ca, "connect_session", map[string]any{"line": sess.ConnectLine()})
	handle, _ := res["session"].(string)
	if !strings.HasPrefix(handle, "s_") {
		t.Fatalf("connect_session on A: %v", res)
	}
	obs := mcpCallTool(t, cb, "observe", map[string]any{"session": handle})
	if obs["state"] == nil {
		t.Fatalf("observe on B with A's handle: %v", obs)
	}
	// A made-up handle is still unknown on B.
	if r := mcpCallTool(t, cb, "observe", map[string]any{"session": "s_aaaaaaaaaaaaaaaa"}); r["state"] != nil {
		t.Fatalf("observe with an unknown handle: %v", r)
	}
}

func mcpModern(t *testing.T, url string) *mcpclient.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(url)
	if err != nil {
		t.Fatal(err)
	}
	c := mcpclient.NewClient(tr)
	if err := c.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "cluster-test", Version: "1"}
	if _, err := c.Initialize(ctxT(t), init); err != nil {
		t.Fatal(err)
	}
	if !mcpgo.IsModernProtocol(c.ProtocolVersion()) {
		t.Fatalf("negotiated %q, want the modern era", c.ProtocolVersion())
	}
	return c
}

// mcpCallTool calls a tool and returns its structured content (or the text
// of an error result under "error").
func mcpCallTool(t *testing.T, c *mcpclient.Client, name string, args map[string]any) map[string]any {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	r, err := c.CallTool(ctxT(t), req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out := map[string]any{}
	if m, ok := r.StructuredContent.(map[string]any); ok {
		out = m
	} else if r.StructuredContent != nil {
		b, _ := json.Marshal(r.StructuredContent)
		_ = json.Unmarshal(b, &out)
	}
	if r.IsError {
		out["isError"] = true
	}
	return out
}

// A revocation on node A is seen on node B: B reads its token records from
// a replica that the KV watch keeps current (no MaxAge cache in front of
// it, unlike tokens.CachedStore on SQLite), so the token is refused there
// as soon as the change arrives, and the tab held by B is dropped.
func TestClusterRevokeSeenOnOtherNode(t *testing.T) {
	t.Parallel()
	ns := nodes(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	sess, err := a.Mint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := lapdtest.Dial(ctx, b.WSURL(), sess.Token, lapdtest.WithTabSecret(sess.TabSecret))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	if st, _, body := post(t, b.LAPURL()+"/observe", sess.Token, `{}`); st != 200 {
		t.Fatalf("observe on B = %d %v", st, body)
	}
	if err := a.Lapd.Revoke(ctx, sess.TID); err != nil {
		t.Fatal(err)
	}
	select { // A asked B, the tab's node, to drop it
	case <-tab.Done():
	case <-ctx.Done():
		t.Fatal("the tab on B was not dropped after the revocation on A")
	}
	waitUntil(t, "B to refuse the revoked token", func() bool {
		st, _, _ := post(t, b.LAPURL()+"/observe", sess.Token, `{}`)
		return st == 403
	})
	if _, err := b.Lapd.Tokens().Verify(ctx, sess.Token); !errors.Is(err, tokens.ErrRevoked) {
		t.Fatalf("Verify on B = %v, want ErrRevoked", err)
	}
	if tab2, err := lapdtest.Dial(ctx, b.WSURL(), sess.Token, lapdtest.WithTabSecret(sess.TabSecret)); err == nil {
		tab2.Close()
		t.Fatal("B accepted a socket for a token revoked on A")
	}
}

// /readyz of a node cut off from NATS says not ready (the load balancer
// drains it), and ready again once the connection is back.
func TestClusterReadyzFollowsNATS(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	nc := ns.Connect(t)
	srv := lapdtest.NewServer(lapd.Config{NATSConn: nc, ClusterName: fmt.Sprintf("c%d", clusterN.Add(1))})
	defer srv.Close()
	get := func() (int, string) {
		res, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if st, body := get(); st != 200 || !strings.Contains(body, `"nats"`) {
		t.Fatalf("readyz connected: %d %s", st, body)
	}
	ns.Shutdown()
	waitUntil(t, "the client to notice the server is gone", func() bool { return !nc.IsConnected() })
	if st, body := get(); st != 503 || !strings.Contains(body, "not connected to NATS") {
		t.Fatalf("readyz without NATS: %d %s", st, body)
	}
}

// The forwarder's counters reach /metrics: the node without the tab counts
// what it sent, the tab's node what it served and the tab it owns.
func TestClusterMetrics(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	name := fmt.Sprintf("c%d", clusterN.Add(1))
	a, admA := adminServer(t, lapd.Config{NATSConn: ns.Connect(t), ClusterName: name, NodeID: "a"})
	b, admB := adminServer(t, lapd.Config{NATSConn: ns.Connect(t), ClusterName: name, NodeID: "b"})
	ctx := ctxT(t)
	tab, sess, err := a.Pair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	for range 2 {
		if st, _, body := post(t, b.LAPURL()+"/observe", sess.Token, `{}`); st != 200 {
			t.Fatalf("observe via B = %d %v", st, body)
		}
	}
	fa, _ := scrape(t, admA.URL, "")
	fb, _ := scrape(t, admB.URL, "")
	if v := value(fb, "lapd_cluster_forwarded_total", "outcome", "sent"); v < 2 {
		t.Errorf("B forwarded %v, want ≥ 2", v)
	}
	// After the first admit (by NATS: it names A's peer link), B's calls go on the link.
	if v := value(fb, "lapd_cluster_peer_total", "outcome", "sent"); v < 2 {
		t.Errorf("B sent %v requests on the peer link, want ≥ 2", v)
	}
	if v := value(fa, "lapd_cluster_served_total"); v < 2 {
		t.Errorf("A served %v, want ≥ 2", v)
	}
	if v := value(fa, "lapd_cluster_tabs_owned"); v != 1 {
		t.Errorf("A owns %v tabs, want 1", v)
	}
	if v := value(fb, "lapd_cluster_tabs_owned"); v != 0 {
		t.Errorf("B owns %v tabs, want 0", v)
	}
}

// A node whose NATS server is gone shuts down within its budget: the
// NATS-bound closes (the buckets' watches, the audit stream's pending
// acknowledgements) give up at once instead of each waiting for its own
// timeout (they took 26 s past a 10 s --shutdown-timeout).
func TestClusterShutdownWithoutNATS(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	srv := lapdtest.NewServer(lapd.Config{NATSURL: ns.URL(), ClusterName: fmt.Sprintf("c%d", clusterN.Add(1)), AuditNATS: true})
	defer srv.Close()
	tab, sess, err := srv.Pair(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	if st, _, body := post(t, srv.LAPURL()+"/observe", sess.Token, `{}`); st != 200 {
		t.Fatalf("observe: %d %v", st, body)
	}
	ns.Shutdown()
	waitUntil(t, "the node to notice NATS is gone", func() bool {
		res, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == 503
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = srv.Lapd.Shutdown(ctx) // errors are expected: entries the stream never acknowledged
	if ctx.Err() != nil {
		t.Fatal("Shutdown ran past its 20 s budget with NATS gone")
	}
}
