package lapd_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd"
	"github.com/lapd-dev/lapd/internal/natstest"
	"github.com/lapd-dev/lapd/lapdtest"
	"github.com/lapd-dev/lapd/pairing"
)

// natsProxy stands between one node and the NATS server, so that node alone
// can be cut off from NATS while its tabs' sockets, its HTTP listener and
// its peer link stay up (a network partition between the node and NATS).
type natsProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	cutOn bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newNATSProxy(t *testing.T, upstream string) *natsProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &natsProxy{t: t, ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's nats:// URL, for the node's Config.NATSURL.
func (p *natsProxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *natsProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cutOn {
			p.mu.Unlock()
			c.Close() // refused while cut: the client keeps retrying
			continue
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *natsProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// cut closes every connection through the proxy and refuses new ones until
// heal.
func (p *natsProxy) cut() {
	p.mu.Lock()
	p.cutOn = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *natsProxy) heal() {
	p.mu.Lock()
	p.cutOn = false
	p.mu.Unlock()
}

func (p *natsProxy) close() {
	p.cut()
	p.ln.Close()
	p.wg.Wait()
}

// partitionNodes starts n nodes on one NATS server, each connected through
// a proxy of its own.
func partitionNodes(t *testing.T, n int) ([]*lapdtest.Server, []*natsProxy) {
	t.Helper()
	ns := natstest.Start(t)
	name := fmt.Sprintf("c%d", clusterN.Add(1))
	var out []*lapdtest.Server
	var ps []*natsProxy
	for i := range n {
		p := newNATSProxy(t, strings.TrimPrefix(ns.URL(), "nats://"))
		s := lapdtest.NewServer(lapd.Config{NATSURL: p.URL(), ClusterName: name, NodeID: fmt.Sprint("n", i), Grace: 5 * time.Second})
		t.Cleanup(s.Close)
		out = append(out, s)
		ps = append(ps, p)
	}
	return out, ps
}

// ready reports whether s's /readyz answers 200.
func ready(t *testing.T, s *lapdtest.Server) bool {
	t.Helper()
	res, err := http.Get(s.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode == 200
}

// stats is n's forwarder counters.
func stats(n *lapdtest.Server) pairing.ClusterStats { return n.Lapd.Stats().Pairing.Cluster }

// A node cut off from NATS for a while, with no takeover meanwhile: it goes
// on serving its own tab from its replica, a node that knows its peer link
// still reaches the tab, one that does not gets 503 paused with nothing
// sent; writes to the buckets fail at once (503 unavailable), not after
// JetStream's 5 s; after the heal everything works again by itself, and
// every call reached the tab exactly once.
func TestClusterPartitionHeals(t *testing.T) {
	t.Parallel()
	ns, ps := partitionNodes(t, 3)
	a, b, c := ns[0], ns[1], ns[2]
	ctx := ctxT(t)
	tab, sess, err := a.Pair(ctx, lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	if st, _, body := post(t, b.LAPURL()+"/observe", sess.Token, `{}`); st != 200 {
		t.Fatalf("observe via B = %d %v", st, body) // B learns A's peer link
	}

	ps[0].cut()
	waitUntil(t, "A's /readyz to say not ready", func() bool { return !ready(t, a) })
	msg := func(n *lapdtest.Server, key string) (int, map[string]any) {
		st, _, body := post(t, n.LAPURL()+"/message", sess.Token, `{"msg":{"type":"inc"},"idempotencyKey":"`+key+`"}`)
		return st, body
	}
	// A serves its own tab (the token is checked in its replica).
	if st, body := msg(a, "on-a"); st != 200 || body["status"] != "dispatched" {
		t.Fatalf("message on A, cut off = %d %v", st, body)
	}
	// B reaches the tab on A's peer link, which does not need NATS.
	if st, body := msg(b, "on-b"); st != 200 || body["status"] != "dispatched" {
		t.Fatalf("message on B, A cut off = %d %v", st, body)
	}
	// C never heard of A for this tab: NATS finds nobody holding it.
	st, hdr, body := post(t, c.LAPURL()+"/observe", sess.Token, `{}`)
	if code, _ := body["error"].(map[string]any)["code"].(string); st != 503 || code != "paused" || hdr.Get("Retry-After") == "" {
		t.Fatalf("observe on C, A cut off = %d %v", st, body)
	}
	// A bucket write on A fails at once: 503 unavailable, retry soon.
	res, err := http.Post(a.URL+"/agent/mint", "application/json", strings.NewReader(`{"tab":true}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("mint on A, cut off = %d (Retry-After %q), want 503 with Retry-After", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if n := tab.RPCCount("send_message"); n != 2 {
		t.Fatalf("tab saw %d send_message frames while A was cut off, want 2", n)
	}

	healed := time.Now()
	ps[0].heal()
	waitUntil(t, "A's /readyz to say ready", func() bool { return ready(t, a) })
	readyIn := time.Since(healed)
	// A's subscriptions are back: C's calls reach the tab again.
	waitUntil(t, "C to reach the tab", func() bool {
		st, _, _ := post(t, c.LAPURL()+"/observe", sess.Token, `{}`)
		return st == 200
	})
	t.Logf("after the heal: A ready in %v, C reached the tab in %v", readyIn, time.Since(healed)) // for docs/CLUSTER.md, not asserted
	for i, n := range ns {
		if st, body := msg(n, fmt.Sprint("healed-", i)); st != 200 || body["status"] != "dispatched" {
			t.Fatalf("message on node %d after the heal = %d %v", i, st, body)
		}
	}
	if n := tab.RPCCount("send_message"); n != 5 {
		t.Fatalf("tab saw %d send_message frames, want 5 (each call once)", n)
	}
	select {
	case <-tab.Done():
		t.Fatalf("the tab's socket closed (%d): nobody took it over", tab.CloseStatus())
	default:
	}
	if sa := stats(a); sa.Owned != 1 || sa.Reannounced != 1 {
		t.Fatalf("A's cluster stats after the heal: %+v, want the tab owned and re-announced once", sa)
	}
	if rec, err := a.Lapd.Tokens().Get(ctx, sess.TID); err != nil || rec.Status != "active" {
		t.Fatalf("record after the heal = %+v, %v", rec, err)
	}
}

// A node cut off from NATS while its tab's tid is taken over on another
// node (a duplicate tab, or the load balancer moved a reconnecting tab):
// during the cut each node reaches its own socket; once the cut-off node
// is back, whichever node's connection comes back first, exactly one
// owner is left, the newer socket: the older one is closed with 4002
// (superseded), and every call after that reaches the newer socket.
func TestClusterPartitionTakeover(t *testing.T) {
	t.Parallel()
	for _, order := range []string{"a-heals", "both-heal-together", "a-heals-first", "b-heals-first"} {
		t.Run(order, func(t *testing.T) {
			t.Parallel()
			partitionTakeover(t, order)
		})
	}
}

func partitionTakeover(t *testing.T, order string) {
	ns, ps := partitionNodes(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	app := lapdtest.DemoApp()
	tab1, sess, err := a.Pair(ctx, lapdtest.WithApp(app))
	if err != nil {
		t.Fatal(err)
	}
	defer tab1.Close()
	msg := func(n *lapdtest.Server, key string) (int, map[string]any) {
		st, _, body := post(t, n.LAPURL()+"/message", sess.Token, `{"msg":{"type":"inc"},"idempotencyKey":"`+key+`"}`)
		return st, body
	}

	ps[0].cut()
	waitUntil(t, "A's /readyz to say not ready", func() bool { return !ready(t, a) })
	tab2, err := lapdtest.Dial(ctx, b.WSURL(), sess.Token, lapdtest.WithTabSecret(sess.TabSecret), lapdtest.WithApp(app))
	if err != nil {
		t.Fatal(err)
	}
	defer tab2.Close()
	// During the cut each node reaches the socket it holds: A has not
	// heard of the takeover (nothing tells it without NATS).
	if st, body := msg(a, "cut-a"); st != 200 || body["status"] != "dispatched" {
		t.Fatalf("message on A, cut off = %d %v", st, body)
	}
	if st, body := msg(b, "cut-b"); st != 200 || body["status"] != "dispatched" {
		t.Fatalf("message on B = %d %v", st, body)
	}
	if n1, n2 := tab1.RPCCount("send_message"), tab2.RPCCount("send_message"); n1 != 1 || n2 != 1 {
		t.Fatalf("during the cut: tab on A saw %d send_message, tab on B %d; want 1 each", n1, n2)
	}

	switch order {
	case "a-heals":
		ps[0].heal()
	case "both-heal-together":
		ps[1].cut()
		waitUntil(t, "B's /readyz to say not ready", func() bool { return !ready(t, b) })
		ps[0].heal()
		ps[1].heal()
	case "a-heals-first":
		// A comes back and re-announces its (older) socket while B is
		// cut off and cannot answer; B's own re-announce settles it.
		ps[1].cut()
		waitUntil(t, "B's /readyz to say not ready", func() bool { return !ready(t, b) })
		ps[0].heal()
		waitUntil(t, "A to re-announce", func() bool { return stats(a).Reannounced == 1 })
		ps[1].heal()
	case "b-heals-first":
		ps[1].cut()
		waitUntil(t, "B's /readyz to say not ready", func() bool { return !ready(t, b) })
		ps[1].heal()
		waitUntil(t, "B to re-announce", func() bool { return stats(b).Reannounced == 1 })
		ps[0].heal()
	}
	select {
	case <-tab1.Done():
		if c := tab1.CloseStatus(); c != 4002 {
			t.Fatalf("the older socket closed with %d, want 4002 (superseded)", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the older socket on A is still open after the heal (two owners)")
	}
	waitUntil(t, "both nodes ready", func() bool { return ready(t, a) && ready(t, b) })
	select {
	case <-tab2.Done():
		t.Fatalf("the newer socket on B closed (%d)", tab2.CloseStatus())
	default:
	}
	if sa, sb := stats(a), stats(b); sa.Owned != 0 || sb.Owned != 1 {
		t.Fatalf("owned: A %d, B %d; want 0 and 1", sa.Owned, sb.Owned)
	}
	for i, n := range ns {
		if st, body := msg(n, fmt.Sprint("healed-", i)); st != 200 || body["status"] != "dispatched" {
			t.Fatalf("message on node %d after the heal = %d %v", i, st, body)
		}
	}
	if n1, n2 := tab1.RPCCount("send_message"), tab2.RPCCount("send_message"); n1 != 1 || n2 != 3 {
		t.Fatalf("after the heal: the older socket saw %d send_message, the newer %d; want 1 and 3", n1, n2)
	}
	// The record stays active: the node that let go did not mark it
	// pending-resume.
	if rec, err := b.Lapd.Tokens().Get(ctx, sess.TID); err != nil || rec.Status != "active" {
		t.Fatalf("record after the heal = %+v, %v", rec, err)
	}
}

// A session revoked on another node while the tab's node is cut off from
// NATS: the revoking node's request to drop the tab finds nobody, and the
// cut-off node still accepts the token from its replica until it is back;
// then it learns the revocation from the token bucket's watch, refuses the
// token and closes the tab's socket as a revocation does (4001, after
// {t:'revoked'}).
func TestClusterPartitionRevoke(t *testing.T) {
	t.Parallel()
	ns, ps := partitionNodes(t, 2)
	a, b := ns[0], ns[1]
	ctx := ctxT(t)
	tab, sess, err := a.Pair(ctx, lapdtest.WithApp(lapdtest.DemoApp()))
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	ps[0].cut()
	waitUntil(t, "A's /readyz to say not ready", func() bool { return !ready(t, a) })
	if err := b.Lapd.Revoke(ctx, sess.TID); err != nil {
		t.Fatal(err)
	}
	if st, _, body := post(t, b.LAPURL()+"/observe", sess.Token, `{}`); st != 403 {
		t.Fatalf("observe on B after the revocation = %d %v", st, body)
	}
	if st, _, body := post(t, a.LAPURL()+"/observe", sess.Token, `{}`); st != 200 {
		t.Fatalf("observe on A, cut off, after the revocation = %d %v (its replica has not heard)", st, body)
	}
	ps[0].heal()
	select {
	case <-tab.Done():
		if c := tab.CloseStatus(); c != 4001 {
			t.Fatalf("the revoked tab's socket closed with %d, want 4001", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked tab's socket on A is still open after the heal")
	}
	if tab.Count("revoked") != 1 {
		t.Fatalf("the tab got %d {t:'revoked'} frames, want 1", tab.Count("revoked"))
	}
	if st, _, body := post(t, a.LAPURL()+"/observe", sess.Token, `{}`); st != 403 {
		t.Fatalf("observe on A after the heal = %d %v", st, body)
	}
	if sa := stats(a); sa.Owned != 0 {
		t.Fatalf("A still owns %d tabs", sa.Owned)
	}
}

// The takeover rule itself: a takeover for a tid held here with an older
// revision than the socket here (a node that was cut off from NATS) leaves
// the socket open and is answered with this node's own takeover, with its
// revision; a takeover without a revision (an older lapd) is obeyed, as
// before.
func TestClusterTakeoverRevisions(t *testing.T) {
	t.Parallel()
	nsrv, name, ns := nodesOn(t, 1)
	a := ns[0]
	ctx := ctxT(t)
	tab, sess, err := a.Pair(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Close()
	nc := nsrv.Connect(t)
	spy, err := nc.SubscribeSync(name + ".takeover")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Revision 1 is the record's creation: older than any Connected write.
	stale := &nats.Msg{Subject: name + ".takeover", Data: []byte("elsewhere " + sess.TID), Header: nats.Header{"Lapd-Rev": []string{"1"}}}
	if err := nc.PublishMsg(stale); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := spy.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no answer to a stale takeover: %v", err)
		}
		if string(m.Data) == "elsewhere "+sess.TID {
			continue // the stale one itself
		}
		if rev, _ := strconv.ParseUint(m.Header.Get("Lapd-Rev"), 10, 64); string(m.Data) != "n0 "+sess.TID || rev <= 1 {
			t.Fatalf("answer to a stale takeover: %q rev %q, want A's takeover with a newer revision", m.Data, m.Header.Get("Lapd-Rev"))
		}
		break
	}
	if sa := stats(a); sa.TakeoversRefused != 1 || sa.Owned != 1 {
		t.Fatalf("A after a stale takeover: %+v", sa)
	}
	select {
	case <-tab.Done():
		t.Fatalf("a stale takeover closed the socket (%d)", tab.CloseStatus())
	default:
	}
	if err := nc.Publish(name+".takeover", []byte("elsewhere "+sess.TID)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tab.Done():
		if c := tab.CloseStatus(); c != 4002 {
			t.Fatalf("closed with %d after a takeover without a revision, want 4002", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a takeover without a revision (an older lapd) was not obeyed")
	}
}

// Two sockets for one tab connect at the same moment, one on each node
// (a duplicated tab, a reconnect racing a stale one): one is left, the
// other closed with 4002, whichever order the takeovers cross in, and
// calls made on either node reach the one left.
func TestClusterSimultaneousConnects(t *testing.T) {
	t.Parallel()
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			ns := nodes(t, 2)
			a, b := ns[0], ns[1]
			ctx := ctxT(t)
			app := lapdtest.DemoApp()
			first, sess, err := a.Pair(ctx, lapdtest.WithApp(app))
			if err != nil {
				t.Fatal(err)
			}
			defer first.Close()
			tabs := make([]*lapdtest.Tab, 2)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for j, s := range []*lapdtest.Server{a, b} {
				wg.Go(func() {
					tabs[j], errs[j] = lapdtest.Dial(ctx, s.WSURL(), sess.Token, lapdtest.WithTabSecret(sess.TabSecret), lapdtest.WithApp(app))
				})
			}
			wg.Wait()
			var left *lapdtest.Tab
			switch {
			case errs[0] != nil && errs[1] != nil:
				t.Fatalf("both sockets were refused: %v; %v", errs[0], errs[1])
			case errs[0] != nil || errs[1] != nil:
				// One was superseded before its hello-ack: the other is left.
				k := 0
				if errs[0] != nil {
					k = 1
				}
				if !strings.Contains(errs[1-k].Error(), "4002") {
					t.Fatalf("a socket refused with %v, want 4002 superseded", errs[1-k])
				}
				left = tabs[k]
			default:
				var gone *lapdtest.Tab
				select {
				case <-tabs[0].Done():
					left, gone = tabs[1], tabs[0]
				case <-tabs[1].Done():
					left, gone = tabs[0], tabs[1]
				case <-time.After(10 * time.Second):
					t.Fatal("both sockets are still open: two nodes hold the tab")
				}
				if c := gone.CloseStatus(); c != 4002 {
					t.Fatalf("the socket let go of was closed with %d, want 4002", c)
				}
			}
			defer left.Close()
			for k, s := range []*lapdtest.Server{a, b} {
				before := left.RPCCount("observe")
				var last string
				defer func() {
					if t.Failed() {
						t.Logf("via node %d, the last answer: %s; tabs held: A %d, B %d; the first socket closed: %v", k, last, a.Lapd.Stats().Pairing.ActiveTabs, b.Lapd.Stats().Pairing.ActiveTabs, first.Err())
					}
				}()
				waitUntil(t, fmt.Sprintf("a call via node %d to reach the socket left", k), func() bool {
					st, _, body := post(t, s.LAPURL()+"/observe", sess.Token, `{}`)
					last = fmt.Sprintf("%d %v", st, body)
					return st == 200 && left.RPCCount("observe") > before
				})
			}
			select {
			case <-left.Done():
				t.Fatalf("the socket left was closed too (%d)", left.CloseStatus())
			default:
			}
		})
	}
}
