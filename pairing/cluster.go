package pairing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/kvrep"
	"github.com/lapd-dev/lapd/tokens"
)

// # Several nodes (Config.Cluster)
//
// With Config.Cluster set, Registries of several lapd processes on one NATS
// behave as one. The node that holds a tab's WebSocket owns its tid: it
// subscribes to "<prefix>.tab.<tid>.*" in the queue group "owner" (so a
// request reaches exactly one holder, even while a takeover is under way),
// and every Registry method that finds no live socket here forwards to the
// owner: by NATS request/reply, or, once the owner's admit has named its
// peer link (Config.PeerListen, peer.go), node to node on it:
//
//	admit   the gate's paired? + the owner's per-tid rate limit (Hooks.OnAdmit);
//	        the reply carries the hello generation and the tab's health
//	        (needed only when this node has not heard from the owner for
//	        remoteFresh: see "One round trip" below)
//	hello   the cached hello (kept per tid here until the generation moves)
//	call    one rpc, with the caller's timeout and deadline
//	watch   a watch, until the caller's deadline
//	push    a server→tab frame (log-push, confirm-expire, confirm-sync, active)
//	log     the recent-log ring;  append  AppendLog;  health  Health
//	expect  ExpectLog (the tab's echo of a log-push arrives at the owner)
//	logpush PushLog (expect + push in one request)
//	unregister  drop the tab (revoke)
//
// No responders means no node holds the tab: ErrPaused, as for a tab that is
// not connected here. An answer travels once: the owner answers each request
// once, and the requester takes one reply. A call whose reply does not come
// within its timeout (plus a margin for the hop) is ErrTimeout, and in doubt.
//
// # One round trip per forwarded call
//
// The per-tid rate limit is decided where the tab lives, but asking first
// (admit) and then acting (call) is two round trips. So a gate that has
// heard from the tab's owner within remoteFresh takes "paired" from that
// (DeferAdmit) and lets the request's first forwarded Call, CallReply or
// Watch carry the admit in a header (Lapd-Admit): the owner runs OnAdmit
// before it acts and, if refused, answers a typed error (*RateLimitError)
// without touching the tab. Its reply to such a request carries the hello
// generation and health (Lapd-Gen, Lapd-Health), which keeps this node's
// cache fresh, so a steady stream of calls makes one round trip each. A
// request that ends without a forwarded operation (everything it needed
// was cached here) settles its admit with a plain admit round trip
// (SettleAdmit); a route with side effects before its first Call asks the
// owner first, as before (the lap gate decides which). Trusting a cached
// "paired" is safe: the forwarded operation is checked again by the owner
// (no node holds the tab → no responders → ErrPaused).
//
// A tab that connects to another node takes the tid over: the new owner
// subscribes, then publishes "<prefix>.takeover"; the old owner, if alive,
// closes its socket with 4002 (superseded), fails its in-flight calls with
// ErrPaused (the caller's retry reaches the new owner) and leaves the token
// record alone. A node that loses a socket marks the token pending-resume
// only when no other node holds the tab by then.
//
// # Who owns a tid: the newest connect wins
//
// A takeover is a message, and a node cut off from NATS does not hear it:
// its socket stays open, and when its connection comes back nats.go
// subscribes it to the tid's subjects again, beside the new owner. So every
// takeover says which socket is newer. A socket is accepted only after its
// Connected write to the token record succeeded, a compare-and-set on the
// record's key; the KV revision of that write (tokens.Record.Rev, kept as
// conn.rev) is unique and grows with every later write of the record, by
// any node. The takeover carries it (header Lapd-Rev), and a node holding
// tid with a socket:
//
//   - from a higher revision (or an unknown one: a takeover without the
//     header, from an older lapd) lets go of its socket (4002), as before;
//   - from a lower revision keeps its socket and publishes its own
//     takeover again, so the sender lets go.
//
// And after every reconnect (nats.go's CONNECTED status) a node publishes a
// takeover for each socket it holds, with its revision. Whatever the order
// in which the two nodes come back, or if both do at once, the one with the
// older revision hears the newer one and lets go: exactly one holder is
// left, the newest. A node cut off from NATS cannot accept a socket
// meanwhile (Connected needs the bucket), so it never holds a socket newer
// than the revisions the others know about. It costs one small publish per
// held tab per reconnect, and one map lookup per takeover on each node.

// clusterMargin is what a forwarded call may take beyond its own timeout
// (the NATS hop both ways, the owner's scheduling).
const clusterMargin = 2 * time.Second

// maxRemote bounds the per-tid entries kept for tabs held by other nodes.
const maxRemote = 4096

// remoteFresh: how long an admit's health and generation are trusted.
const remoteFresh = time.Second

type cluster struct {
	r      *Registry
	nc     *nats.Conn
	prefix string
	node   string
	in     chan *nats.Msg
	work   chan *nats.Msg // to an idle worker (unbuffered: taken only by one waiting)
	peer   *peerLink      // nil: every request goes by NATS
	tkSub  *nats.Subscription
	status chan nats.Status // CONNECTED after a reconnect: re-announce (see reassert)

	mu     sync.Mutex
	subs   map[string]tabSub     // tids held here
	remote map[string]*remoteTab // tids held elsewhere (cache)
	absent map[string]time.Time  // tids no node answered for lately (see absentFor)

	forwarded, noResponders, failures, served atomic.Int64
	reasserts                                 atomic.Int64 // takeovers re-published after a reconnect
	staleTakeovers                            atomic.Int64 // takeovers refused: the socket here was newer

	testTakeover     atomic.Pointer[func(tid string)] // tests: called when a takeover from another node has been handled
	testNoResponders func()                           // tests: called when a look by NATS found no node, before the next
}

type remoteTab struct {
	gen    uint64 // hello generation the owner reported last
	at     time.Time
	health Health
	// healthRaw is the reply header health was decoded from ("" when it
	// came from elsewhere, an admit's JSON).
	healthRaw string
	hello     *Hello
	helloGen  uint64
	peer      *peer // the owner's peer link (nil: by NATS)
}

// ClusterStats are the forwarder's counters (zero on a single node).
type ClusterStats struct {
	Forwarded    int64 // requests sent to another node
	NoResponders int64 // … that found no node holding the tab (→ paused)
	Failures     int64 // … that failed otherwise (timeout, NATS errors)
	Served       int64 // requests from other nodes served here
	Owned        int   // tids whose socket is here, subscribed
	// Takeovers published again after a reconnect to NATS (one per socket
	// held then), and takeovers this node refused because its socket for
	// the tid was the newer one (it announced that socket again).
	Reannounced, TakeoversRefused int64
	// The peer link (peer.go), when on.
	Direct      int64 // of Forwarded, sent on the peer link
	Fallbacks   int64 // requests meant for the link that went by NATS (no link, or the tab had moved)
	PeerRefused int64 // inbound link connections refused at the handshake
}

func newCluster(r *Registry, nc *nats.Conn, prefix, node, peerListen, peerAdvertise, peerTLS string) (*cluster, error) {
	if prefix == "" {
		prefix = "lapd"
	}
	if node == "" {
		node = newID()
	}
	c := &cluster{r: r, nc: nc, prefix: prefix, node: node, in: make(chan *nats.Msg, 4096), work: make(chan *nats.Msg),
		subs: map[string]tabSub{}, remote: map[string]*remoteTab{}, absent: map[string]time.Time{}}
	sub, err := nc.Subscribe(prefix+".takeover", c.onTakeover)
	if err != nil {
		return nil, err
	}
	c.tkSub = sub
	if err := c.check(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	if peerListen != "" {
		l, err := newPeerLink(c, peerListen, peerAdvertise, peerTLS)
		if err != nil {
			_ = sub.Unsubscribe()
			return nil, err
		}
		c.peer = l
	}
	c.status = nc.StatusChanged(nats.CONNECTED)
	r.wg.Add(2)
	go c.serve()
	go c.watchReconnects()
	return c, nil
}

// hdrRev is the takeover's header: the revision of the socket's Connected
// write (see "Who owns a tid").
const hdrRev = "Lapd-Rev"

// announce publishes a takeover of tid by this node's socket of revision
// rev (0: unknown, sent without the header).
func (c *cluster) announce(tid string, rev uint64) {
	m := &nats.Msg{Subject: c.prefix + ".takeover", Data: []byte(c.node + " " + tid)}
	if rev != 0 {
		m.Header = nats.Header{hdrRev: []string{strconv.FormatUint(rev, 10)}}
	}
	_ = c.nc.PublishMsg(m)
}

// watchReconnects re-announces the tabs held here after every reconnect.
func (c *cluster) watchReconnects() {
	defer c.r.wg.Done()
	for {
		select {
		case _, ok := <-c.status:
			if !ok {
				return
			}
			c.reassert()
		case <-c.r.stop:
			return
		}
	}
}

// reassert publishes a takeover for every socket held here, with its
// revision: a node that took one of these tids over while this one was
// cut off from NATS answers with its own (newer) takeover, and this node
// lets go (onTakeover); a node holding an older socket for one lets go of
// it. Sockets of revision 0 (a token store without revisions) are not
// announced: nothing would order them.
func (c *cluster) reassert() {
	type held struct {
		tid string
		rev uint64
	}
	var hs []held
	r := c.r
	r.mu.Lock()
	for tid, s := range r.sessions {
		s.mu.Lock()
		if cur := s.cur; cur != nil && cur.rev != 0 {
			hs = append(hs, held{tid, cur.rev})
		}
		s.mu.Unlock()
	}
	r.mu.Unlock()
	for _, h := range hs {
		c.announce(h.tid, h.rev)
	}
	if len(hs) > 0 {
		c.reasserts.Add(int64(len(hs)))
		r.cfg.Logger.Info("pairing: cluster: reconnected to NATS; re-announced the tabs held here", "tabs", len(hs))
	}
}

// check proves, before the node serves, that its NATS user may do what a
// node does with the cluster's subjects: subscribe to a tab's subjects in
// the queue group, request one of them, answer on _INBOX, and publish and
// subscribe to takeover. NATS refuses a subject without permission
// asynchronously (the connection stays up, the message is dropped), so
// without this a node missing a permission would start and then fail on
// the first tab that pairs with it or the first call it forwards.
func (c *cluster) check() error {
	tid := "probe " + c.node // not a tid: lapd's tids are UUIDs
	sub, err := c.nc.QueueSubscribe(c.subject(tid, "*"), "owner", func(m *nats.Msg) { _ = m.Respond(okReply(nil)) })
	if err != nil {
		return fmt.Errorf("pairing: cluster: subscribing to the tab subjects: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	inbox := c.nc.NewInbox()
	replies, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("pairing: cluster: subscribing to an inbox: %w", err)
	}
	defer func() { _ = replies.Unsubscribe() }()
	_ = c.nc.Publish(c.prefix+".takeover", []byte(c.node+" "+tid)) // the other nodes hold no such tab: a no-op
	_ = c.nc.PublishRequest(c.subject(tid, "probe"), inbox, nil)
	// The server answers a refused subscription or publish before the
	// flush's PONG; a refused reply arrives later, in place of the reply.
	err = c.nc.FlushTimeout(5 * time.Second)
	if err == nil && !refused(c.nc) {
		_, err = replies.NextMsg(5 * time.Second)
	}
	if refused(c.nc) {
		return fmt.Errorf("pairing: cluster: NATS refused this node's user a subject a node needs (%v); docs/CLUSTER.md lists the permissions", c.nc.LastError())
	}
	if err != nil {
		return fmt.Errorf("pairing: cluster: a request to this node's own tab subjects did not come back (%w); check the NATS user's permissions (docs/CLUSTER.md)", err)
	}
	return nil
}

func refused(nc *nats.Conn) bool { return errors.Is(nc.LastError(), nats.ErrPermissionViolation) }

func (c *cluster) subject(tid, op string) string {
	return c.prefix + ".tab." + kvrep.Key(tid) + "." + op
}

// tabSub is the subscription to a tid's subjects, and the session it
// serves. Sockets come and go outside the cluster's lock: a socket that
// ends unsubscribes (disown) after it let go of the session, and a new one
// subscribes (own) after it registered, so either may run late. Both
// decide under c.mu from the session as it is then: a late disown keeps
// the subscription while a newer socket of this node holds the session
// (before, it left the node holding the tab unsubscribed, and other nodes
// answered "paused" for a connected tab), and a late own does nothing for
// a socket that already ended (it would have left the node subscribed to a
// tab it does not hold, and told other nodes to let go of theirs).
type tabSub struct {
	sub *nats.Subscription
	s   *session
}

// own subscribes to tid's subjects if socket sock, of revision sock.rev,
// is still its session's socket, and tells the other nodes to let go of
// the tid.
func (c *cluster) own(tid string, sock *conn) {
	c.mu.Lock()
	if sock.s.socket() != sock {
		c.mu.Unlock()
		return // it ended already: its end disowned, or will
	}
	delete(c.remote, tid)
	delete(c.absent, tid)
	if ts, ok := c.subs[tid]; !ok || ts.s != sock.s {
		if ok { // a dropped session's, not yet disowned
			_ = ts.sub.Unsubscribe()
		}
		sub, err := c.nc.ChanQueueSubscribe(c.subject(tid, "*"), "owner", c.in)
		if err != nil {
			delete(c.subs, tid)
			c.mu.Unlock()
			c.r.cfg.Logger.Error("pairing: cluster: subscribing for a tab failed; other nodes cannot reach it", "tid", tid, "err", err)
			return
		}
		c.subs[tid] = tabSub{sub: sub, s: sock.s}
	}
	c.mu.Unlock()
	c.announce(tid, sock.rev)
	// One round trip: the server has the subscription before the tab gets
	// its hello-ack, so a call made on another node right after pairing
	// finds it.
	if err := c.nc.FlushTimeout(2 * time.Second); err != nil {
		c.r.cfg.Logger.Warn("pairing: cluster: NATS did not confirm the tab's subscription", "tid", tid, "err", err)
	}
}

// disown unsubscribes from tid's subjects, a socket of session s having
// ended (or s dropped), unless s has a socket here again.
func (c *cluster) disown(tid string, s *session) {
	c.mu.Lock()
	ts, ok := c.subs[tid]
	if !ok || ts.s != s || s.heldHere() {
		c.mu.Unlock()
		return // another session's, or a newer socket of s holds it
	}
	delete(c.subs, tid)
	c.mu.Unlock()
	_ = ts.sub.Unsubscribe()
}

// liveElsewhere reports whether another node holds tid's socket now. Call
// it after disown (this node no longer answers).
func (c *cluster) liveElsewhere(tid string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	b, err := c.request(ctx, tid, "admit", []byte(`{"probe":true}`))
	if err != nil {
		return false
	}
	var a admitReply
	return json.Unmarshal(b, &a) == nil && a.Paired
}

// orphaned handles a tab whose node died (kill -9, power loss): its record
// is still active, and no node holds its socket. Before the tab is
// accepted here it is moved to pending-resume (with a fresh grace), so the
// accept is a re-pair, as after any drop: {t:'active'} at once and the
// pending approvals re-delivered. The cluster's answer to AfterRestart,
// per tab.
func (c *cluster) orphaned(ctx context.Context, token string) {
	rec, err := c.r.cfg.Tokens.Verify(ctx, token)
	if err != nil || rec.Status != tokens.StatusActive || c.r.holds(rec.TID) || c.liveElsewhere(rec.TID) {
		return
	}
	if _, err := c.r.cfg.Tokens.Disconnected(ctx, rec.TID); err != nil {
		c.r.cfg.Logger.Warn("pairing: cluster: marking an orphaned session pending-resume failed", "tid", rec.TID, "err", err)
	}
}

// onTakeover: another node now holds tid's socket. A live socket here is
// closed with 4002, unless it is the newer one (see "Who owns a tid"): then
// this node announces it again, and the sender lets go. The token record
// is the new owner's.
func (c *cluster) onTakeover(m *nats.Msg) {
	node, tid, ok := strings.Cut(string(m.Data), " ")
	if !ok || node == c.node {
		return
	}
	if h := c.testTakeover.Load(); h != nil {
		defer (*h)(tid)
	}
	rev, _ := strconv.ParseUint(m.Header.Get(hdrRev), 10, 64) // 0: unknown
	c.mu.Lock()
	delete(c.absent, tid)
	if e := c.remote[tid]; e == nil || e.peer == nil || e.peer.node != node {
		// What this node knew of tid's owner is stale. (Requests already
		// going to the announcing node's link keep it: its takeover may
		// arrive after this node learnt the link from its admit reply.)
		delete(c.remote, tid)
	}
	c.mu.Unlock()
	r := c.r
	r.mu.Lock()
	s := r.sessions[tid]
	if s == nil || r.shutting {
		r.mu.Unlock()
		return
	}
	s.mu.Lock()
	old := s.cur
	if old != nil && rev != 0 && old.rev >= rev {
		// The sender's socket is older (it was cut off from NATS when
		// this one connected) or the same write: this one stays.
		keep := old.rev
		s.mu.Unlock()
		r.mu.Unlock()
		if keep > rev {
			c.staleTakeovers.Add(1)
			c.announce(tid, keep)
		}
		return
	}
	var orphans pending
	if old != nil {
		s.cur = nil
		orphans = s.takeAllLocked()
	}
	s.mu.Unlock()
	if old != nil && !s.dropped && r.sessions[tid] == s && s.closedElem == nil {
		s.closedAt = time.Now()
		s.closedElem = r.closed.PushBack(s)
		r.trimClosedLocked()
	}
	r.mu.Unlock()
	if old == nil {
		return
	}
	c.disown(tid, s)
	r.superseded.Add(1)
	old.close(CloseSuperseded, "superseded")
	r.cfg.Audit.Record(context.Background(), audit.Entry{TID: tid, Event: audit.EventDisconnect, Detail: map[string]any{"reason": "superseded-elsewhere"}})
	if h := r.hooks.Load(); h.OnClosed != nil {
		h.OnClosed(tid)
	}
	orphans.fail(ErrPaused)
}

// serve runs the requests other nodes send to the tids held here, each on
// a goroutine of its own while it runs (a call waits for the tab): an idle
// worker's, or a new worker's when none is idle.
func (c *cluster) serve() {
	defer c.r.wg.Done()
	for {
		select {
		case m := <-c.in:
			select {
			case c.work <- m:
			default:
				c.r.wg.Add(1)
				go c.worker(m)
			}
		case <-c.r.stop:
			// Requests that arrived meanwhile: the tab is going away.
			for {
				select {
				case m := <-c.in:
					_ = m.Respond(errReply(ErrPaused, false))
				default:
					return
				}
			}
		}
	}
}

// workerIdle is how long a worker with nothing to do waits for the next
// request before it exits.
const workerIdle = 5 * time.Second

// worker handles m, then the requests serve hands it while it is idle.
// Workers outlive a request because a new goroutine's stack starts small
// and grows by copying as a request goes deep (json, the tab's path), which
// per request showed in the owner's CPU profile (lapbench nats-cross).
func (c *cluster) worker(m *nats.Msg) {
	defer c.r.wg.Done()
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		c.handleNATS(m)
		idle.Reset(workerIdle)
		select {
		case m = <-c.work:
		case <-idle.C:
			return
		case <-c.r.stop:
			return
		}
	}
}

// close unsubscribes everything (Shutdown).
func (c *cluster) close() {
	c.nc.RemoveStatusListener(c.status)
	_ = c.tkSub.Unsubscribe()
	c.mu.Lock()
	subs := c.subs
	c.subs = map[string]tabSub{}
	c.remote = map[string]*remoteTab{}
	c.mu.Unlock()
	for _, ts := range subs {
		_ = ts.sub.Unsubscribe()
	}
}

// Replies: '0' + payload, or '1' + a JSON wireErr.
type wireErr struct {
	E       string `json:"e"` // paused | timeout | closed | busy | rpc | cancelled | rate | other
	Sent    bool   `json:"sent,omitempty"`
	Code    string `json:"code,omitempty"`
	Detail  string `json:"detail,omitempty"`
	RetryMs int64  `json:"retryMs,omitempty"` // rate
}

// Headers of a request that carries its admit, and of the owner's reply.
const (
	hdrAdmit   = "Lapd-Admit"
	hdrGen     = "Lapd-Gen"
	hdrHealth  = "Lapd-Health"
	hdrPeer    = "Lapd-Peer"     // the owner's peer link: "<node> <addr> <key> [<cert>]"
	hdrPeerNet = "Lapd-Peer-Net" // its network namespace (peerInfo.Net)
)

// RateLimitError is the error of a Call, CallReply or Watch whose deferred
// admit (DeferAdmit) the tab's node refused: Hooks.OnAdmit said no, and
// nothing was sent to the tab. RetryAfterMs is OnAdmit's wait (≥ 1).
type RateLimitError struct{ RetryAfterMs int64 }

func (e *RateLimitError) Error() string {
	return "pairing: rate limited on the tab's node; retry in " + strconv.FormatInt(e.RetryAfterMs, 10) + " ms"
}

// deferredAdmit is the admit a request still owes (DeferAdmit): the first
// operation for tid made with its context takes it.
type deferredAdmit struct {
	tid   string
	taken atomic.Bool
}

type admitKey struct{}

// takeAdmit reports whether ctx owes an admit for tid, and marks it paid:
// true once per request.
func takeAdmit(ctx context.Context, tid string) bool {
	d, _ := ctx.Value(admitKey{}).(*deferredAdmit)
	return d != nil && d.tid == tid && d.taken.CompareAndSwap(false, true)
}

// DeferAdmit is Admit for a gate that lets the request's first forwarded
// operation carry the admit (one NATS round trip instead of two; see
// cluster.go). When tid is held by another node that this node heard from
// within the last second, it returns a context that carries the admit, and
// true: the first Call, CallReply or Watch for tid made with it runs
// Hooks.OnAdmit where the tab lives before acting, and fails with
// *RateLimitError, having sent nothing to the tab, if refused. Every request
// given such a context must end with SettleAdmit. Otherwise (a single node,
// a tab held here, nothing fresh known) it returns ctx and false: call Admit.
func (r *Registry) DeferAdmit(ctx context.Context, tid string) (context.Context, bool) {
	if r.cl == nil || !r.remote(tid) || !r.cl.fresh(tid) {
		return ctx, false
	}
	return context.WithValue(ctx, admitKey{}, &deferredAdmit{tid: tid}), true
}

// SettleAdmit runs the admit DeferAdmit put in ctx if no operation has
// carried it yet (the request found all it needed in this node's cache, or
// made no call), with Admit's results. It returns (true, 0, nil) when the
// admit was carried already.
func (r *Registry) SettleAdmit(ctx context.Context, tid string) (paired bool, retryAfterMs int64, err error) {
	if !takeAdmit(ctx, tid) {
		return true, 0, nil
	}
	return r.Admit(ctx, tid)
}

// admitHere runs a deferred admit on the local path (the tab came to this
// node after DeferAdmit): OnAdmit here, before the call acts.
func (r *Registry) admitHere(ctx context.Context, tid string) error {
	if r.cl == nil || !takeAdmit(ctx, tid) {
		return nil
	}
	if h := r.hooks.Load(); h.OnAdmit != nil {
		if ok, ms := h.OnAdmit(tid); !ok {
			return &RateLimitError{RetryAfterMs: max(ms, 1)}
		}
	}
	return nil
}

// unknownOp begins the error detail of an owner asked an op it does not
// serve (an older lapd); the requester sees errUnknownOp.
const unknownOp = "unknown op "

var errUnknownOp = errors.New("pairing: cluster: the tab's node does not serve this request (an older lapd)")

func okReply(b []byte) []byte {
	out := make([]byte, 0, len(b)+1)
	return append(append(out, '0'), b...)
}

// replyBufs lends the owner the buffer of an ok reply: nats.go copies a
// message into its write buffer before Respond returns, so the 10 KiB of
// a typical observe reply need not be a fresh allocation per call.
var replyBufs sync.Pool

// maxPooledReply: larger replies are not kept for reuse.
const maxPooledReply = 256 << 10

func getReply(b []byte) *[]byte {
	p, _ := replyBufs.Get().(*[]byte)
	if p == nil {
		p = new([]byte)
	}
	*p = append(append((*p)[:0], '0'), b...)
	return p
}

func putReply(p *[]byte) {
	if cap(*p) <= maxPooledReply {
		replyBufs.Put(p)
	}
}

func errReply(err error, sent bool) []byte {
	w := wireErr{E: "other", Sent: sent || errors.Is(err, ErrOutcomeUnknown), Detail: err.Error()}
	var re *RPCError
	var rl *RateLimitError
	switch {
	case errors.As(err, &re):
		w = wireErr{E: "rpc", Code: re.Code, Detail: re.Detail}
	case errors.As(err, &rl):
		w = wireErr{E: "rate", RetryMs: rl.RetryAfterMs}
	case errors.Is(err, ErrPaused):
		w.E = "paused"
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		w.E = "timeout"
	case errors.Is(err, ErrClosed):
		w.E = "closed"
	case errors.Is(err, ErrBusy):
		w.E = "busy"
	case errors.Is(err, context.Canceled):
		w.E = "cancelled"
	}
	b, _ := json.Marshal(w)
	return append([]byte{'1'}, b...)
}

// decodeReply turns a reply into the payload or the error the local call
// would have returned. An owner that is shutting down means paused here:
// the tab reconnects to another node.
func decodeReply(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, errors.New("pairing: cluster: empty reply")
	}
	if b[0] == '0' {
		return b[1:], nil
	}
	var w wireErr
	if err := json.Unmarshal(b[1:], &w); err != nil {
		return nil, errors.New("pairing: cluster: bad reply")
	}
	var err error
	switch w.E {
	case "rpc":
		return nil, &RPCError{Code: w.Code, Detail: w.Detail}
	case "rate":
		return nil, &RateLimitError{RetryAfterMs: max(w.RetryMs, 1)}
	case "paused", "closed":
		err = ErrPaused
	case "timeout":
		err = ErrTimeout
	case "busy":
		err = ErrBusy
	case "cancelled":
		err = context.Canceled
	default:
		err = errors.New("pairing: cluster: " + w.Detail)
		if strings.HasPrefix(w.Detail, unknownOp) {
			err = errUnknownOp
		}
	}
	if w.Sent {
		err = inDoubt{err}
	}
	return nil, err
}

// request sends op for tid to its owner and returns the reply payload, or
// ErrPaused when no node holds the tab.
// When ctx owes tid's admit (DeferAdmit), the request carries it.
func (c *cluster) request(ctx context.Context, tid, op string, data []byte) ([]byte, error) {
	b, buf, err := c.requestLent(ctx, time.Time{}, tid, op, data)
	if buf != nil {
		b = append([]byte(nil), b...)
		putReadBuf(buf)
	}
	return b, err
}

// requestLent is request whose payload may alias a pooled read buffer
// (buf non-nil: release it with putReadBuf once done with the payload).
// The request goes on the peer link when the owner's is known and
// reachable, by NATS otherwise. A non-zero deadline ends the request
// before ctx's own, if earlier (context.DeadlineExceeded): on the link
// without a derived context and its timer, which a forwarded call paid
// for on every call (NATS needs one, made only when it carries the
// request).
func (c *cluster) requestLent(ctx context.Context, deadline time.Time, tid, op string, data []byte) ([]byte, *bytes.Buffer, error) {
	c.forwarded.Add(1)
	admit := takeAdmit(ctx, tid)
	if p := c.peerOf(tid); p != nil {
		a, err := p.request(ctx, deadline, op, tid, admit, data)
		switch {
		case err == nil:
			if a.meta {
				c.refresh(tid, a.gen, a.health)
			}
			b, err := decodeReply(a.body)
			if err != nil || len(b) == 0 {
				putReadBuf(a.buf)
				return nil, nil, err
			}
			return b, a.buf, nil
		case errors.Is(err, errMoved):
			c.setPeer(tid, nil, p)
			p.l.fallback.Add(1)
		case errors.Is(err, errNoLink):
			p.l.fallback.Add(1)
		default: // ErrLinkLost, or ctx ended
			c.failures.Add(1)
			if errors.Is(err, ErrLinkLost) {
				// The tab's node went away with the request on it: its
				// tabs re-pair elsewhere (paused), and a call may have
				// reached the tab (in doubt), as on a takeover. (Still
				// ErrLinkLost too: an admit reports the node silent.)
				err = errors.Join(ErrPaused, ErrLinkLost)
				if op == "call" {
					err = inDoubt{err}
				}
			}
			return nil, nil, err
		}
	}
	if d, ok := ctx.Deadline(); !deadline.IsZero() && (!ok || deadline.Before(d)) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	req := &nats.Msg{Subject: c.subject(tid, op), Data: data}
	if admit {
		req.Header = nats.Header{hdrAdmit: []string{"1"}}
	}
	m, err := c.nc.RequestMsgWithContext(ctx, req)
	relook := errors.Is(err, nats.ErrNoResponders) && !c.absentLately(tid)
	for _, d := range noResponderRetry {
		if !relook || !errors.Is(err, nats.ErrNoResponders) {
			break
		}
		if h := c.testNoResponders; h != nil {
			h()
		}
		if !sleepCtx(ctx, d) {
			break
		}
		m, err = c.nc.RequestMsgWithContext(ctx, req)
	}
	switch {
	case err == nil:
		if g := m.Header.Get(hdrGen); g != "" {
			if gen, err := strconv.ParseUint(g, 10, 64); err == nil {
				c.refresh(tid, gen, []byte(m.Header.Get(hdrHealth)))
			}
			if c.peer != nil {
				if f := strings.Fields(m.Header.Get(hdrPeer)); len(f) == 3 || len(f) == 4 {
					pi := &peerInfo{Node: f[0], Addr: f[1], Key: f[2]}
					if len(f) == 4 {
						pi.Cert = f[3]
					}
					pi.Net = m.Header.Get(hdrPeerNet)
					c.setPeer(tid, c.peer.learn(pi), nil)
				}
			}
		}
		b, err := decodeReply(m.Data)
		return b, nil, err
	case errors.Is(err, nats.ErrNoResponders):
		c.noResponders.Add(1)
		c.forgetRemote(tid)
		if relook {
			c.markAbsent(tid)
		}
		return nil, nil, ErrPaused
	case ctx.Err() != nil:
		c.failures.Add(1)
		return nil, nil, ctx.Err()
	}
	c.failures.Add(1)
	if errors.Is(err, nats.ErrTimeout) {
		return nil, nil, ErrTimeout
	}
	c.r.cfg.Logger.Warn("pairing: cluster: forwarding to the tab's node failed", "tid", tid, "op", op, "err", err)
	return nil, nil, ErrPaused
}

// noResponderRetry spaces the second and third looks for a tab's node
// when NATS found no subscriber. Delivered to nobody, the request is safe
// to send again, and the servers of a NATS cluster learn a subscription
// from each other a moment after the node made it on its own server (the
// tab's hello-ack waits for that one only): a call made on another node
// right after the tab paired, through another server, finds it on a later
// look. A tab that is really not connected is answered paused 120 ms later.
var noResponderRetry = [...]time.Duration{20 * time.Millisecond, 100 * time.Millisecond}

// The looks again are paid once per tid per absentFor: a tab found
// absent three times is looked for once by the calls that follow within
// that second (a token holder calling a closed tab in a loop makes one
// NATS request per call, as before the looks again, not three). A takeover
// heard for the tid, or a tab of it accepted here, ends that.
const absentFor = time.Second

func (c *cluster) absentLately(tid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.absent[tid]
	return ok && time.Since(at) < absentFor
}

func (c *cluster) markAbsent(tid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.absent) >= maxRemote {
		clear(c.absent) // many closed tabs called at once: start over rather than grow
	}
	c.absent[tid] = time.Now()
}

// sleepCtx waits d, or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// peerOf returns the peer tid's requests go to directly (nil: by NATS).
func (c *cluster) peerOf(tid string) *peer {
	if c.peer == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.remote[tid]; e != nil {
		return e.peer
	}
	return nil
}

// setPeer records p as tid's owner's link; with was non-nil, only if the
// entry still names was (a "moved" answer does not undo a newer lesson).
func (c *cluster) setPeer(tid string, p, was *peer) {
	if c.peer == nil {
		return
	}
	e := c.remoteEntry(tid)
	c.mu.Lock()
	if was == nil || e.peer == was {
		e.peer = p
	}
	c.mu.Unlock()
}

// forgetRemote drops what this node kept about a tab held elsewhere.
func (c *cluster) forgetRemote(tid string) {
	c.mu.Lock()
	_, had := c.remote[tid]
	delete(c.remote, tid)
	c.mu.Unlock()
	if had {
		c.r.remoteGone(tid)
	}
}

func (c *cluster) remoteEntry(tid string) *remoteTab {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.remote[tid]
	if e == nil {
		if len(c.remote) >= maxRemote {
			for k := range c.remote { // evict one at random
				delete(c.remote, k)
				defer c.r.remoteGone(k)
				break
			}
		}
		e = &remoteTab{}
		c.remote[tid] = e
	}
	return e
}

// fresh reports whether this node heard from tid's owner within
// remoteFresh (an admit, or a reply to a request that carried one).
func (c *cluster) fresh(tid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.remote[tid]
	return e != nil && time.Since(e.at) < remoteFresh
}

// refresh records the hello generation and health an owner's reply carried.
// The health is decoded only when it differs from the last one this node
// decoded for tid (it moves with the heartbeats, not with every call).
func (c *cluster) refresh(tid string, g uint64, health []byte) {
	e := c.remoteEntry(tid)
	c.mu.Lock()
	same := e.healthRaw == string(health) && len(health) > 0
	c.mu.Unlock()
	var h Health
	if !same && json.Unmarshal(health, &h) != nil {
		return
	}
	now := time.Now()
	c.mu.Lock()
	e.gen, e.at = g, now
	if !same {
		e.health, e.healthRaw = h, string(health)
	}
	c.mu.Unlock()
}

type admitReply struct {
	Paired  bool      `json:"paired"`
	OK      bool      `json:"ok"`
	RetryMs int64     `json:"retryMs,omitempty"`
	Gen     uint64    `json:"gen"`
	Health  Health    `json:"health"`
	Peer    *peerInfo `json:"peer,omitempty"` // the owner's peer link (peer.go)
}

// admitTimeout bounds an admit: the caller's context may have no deadline
// (an HTTP request), and an owner that stops between taking the request
// and answering it would otherwise leave the caller waiting for ever.
const admitTimeout = 5 * time.Second

// admit asks the owner whether tid is paired and may make a call now.
func (c *cluster) admit(ctx context.Context, tid string) (paired bool, retryMs int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, admitTimeout)
	defer cancel()
	b, err := c.request(ctx, tid, "admit", nil)
	if errors.Is(err, ErrPaused) && !errors.Is(err, ErrLinkLost) {
		return false, 0, nil // no node holds it
	}
	if err != nil {
		return false, 0, err
	}
	var a admitReply
	if err := json.Unmarshal(b, &a); err != nil {
		return false, 0, err
	}
	if !a.Paired {
		c.forgetRemote(tid)
		return false, 0, nil
	}
	var p *peer
	if c.peer != nil {
		p = c.peer.learn(a.Peer)
	}
	e := c.remoteEntry(tid)
	c.mu.Lock()
	e.gen, e.at, e.health, e.healthRaw = a.Gen, time.Now(), a.Health, ""
	if c.peer != nil {
		e.peer = p
	}
	c.mu.Unlock()
	if !a.OK {
		return true, max(a.RetryMs, 1), nil
	}
	return true, 0, nil
}

// hello returns tid's hello from its owner (cached until the owner reports
// another generation).
func (c *cluster) hello(tid string) (Hello, bool, error) {
	c.mu.Lock()
	if e := c.remote[tid]; e != nil && e.hello != nil && e.helloGen == e.gen && time.Since(e.at) < remoteFresh {
		h := *e.hello
		c.mu.Unlock()
		return h, true, nil
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := c.request(ctx, tid, "hello", nil)
	if err != nil {
		return Hello{}, false, err
	}
	var hr struct {
		Gen   uint64 `json:"gen"`
		Hello *Hello `json:"hello"`
	}
	if err := json.Unmarshal(b, &hr); err != nil || hr.Hello == nil {
		return Hello{}, false, err
	}
	e := c.remoteEntry(tid)
	c.mu.Lock()
	e.hello, e.helloGen = hr.Hello, hr.Gen
	if hr.Gen != e.gen {
		e.gen, e.at = hr.Gen, time.Now()
	}
	c.mu.Unlock()
	return *hr.Hello, true, nil
}

type callReq struct {
	Tool      string          `json:"tool,omitempty"`
	Args      json.RawMessage `json:"args,omitempty"`
	TimeoutMs int64           `json:"timeoutMs,omitempty"`
	WaitMs    int64           `json:"waitMs,omitempty"` // the caller's deadline, from now; 0 = none
	Path      string          `json:"path,omitempty"`
	N         int             `json:"n,omitempty"`
	Kind      string          `json:"kind,omitempty"`
	Probe     bool            `json:"probe,omitempty"`
	RID       string          `json:"rid,omitempty"`    // the caller's request id (audit.RequestID)
	Expect    string          `json:"expect,omitempty"` // a log entry id the tab will echo (ExpectLog)
}

func waitMs(ctx context.Context) int64 {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d).Milliseconds(), 1)
	}
	return 0
}

func (c *cluster) call(ctx context.Context, tid, tool string, args any, timeout time.Duration) callResult {
	a, err := marshalArgs(args)
	if err != nil {
		return callResult{err: err}
	}
	b := appendCallReq(nil, &callReq{Tool: tool, Args: a, TimeoutMs: timeout.Milliseconds(), WaitMs: waitMs(ctx), RID: audit.RequestID(ctx)})
	res, buf, err := c.requestLent(ctx, time.Now().Add(timeout+clusterMargin), tid, "call", b)
	if err != nil {
		var re *RPCError
		var rl *RateLimitError
		if !errors.Is(err, ErrPaused) && !errors.Is(err, ErrBusy) && !errors.As(err, &re) && !errors.As(err, &rl) && !errors.Is(err, ErrOutcomeUnknown) {
			// The request left: the owner may have sent the frame.
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				err = ErrTimeout
			}
			err = inDoubt{err}
		}
		return callResult{err: err}
	}
	return callResult{data: res, buf: buf}
}

func (c *cluster) watch(ctx context.Context, tid, path string) (json.RawMessage, error) {
	b := appendCallReq(nil, &callReq{Path: path, WaitMs: waitMs(ctx)})
	rctx := ctx
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(ctx, d.Add(clusterMargin))
		defer cancel()
	}
	res, err := c.request(rctx, tid, "watch", b)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		err = ErrTimeout
	}
	return res, err
}

// pushLog is Registry.PushLog for a tab on another node: one request. An
// owner that does not know the op (an older lapd during a rolling upgrade)
// gets the two requests it knows, the admit having been carried by the
// refused one.
func (c *cluster) pushLog(ctx context.Context, tid, id string, frame []byte) error {
	b := appendCallReq(nil, &callReq{Expect: id, Args: frame})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.request(ctx, tid, "logpush", b)
	if errors.Is(err, errUnknownOp) {
		c.r.ExpectLog(tid, id)
		_, err = c.request(ctx, tid, "push", frame)
	}
	return err
}

func (c *cluster) simple(tid, op string, data []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.request(ctx, tid, op, data)
}

// replyMeta is what an owner adds to its answer to a request that carried
// its admit: the hello generation and the tab's health (JSON). health is
// valid only while the answer is written (its buffer is reused after).
type replyMeta struct {
	gen    uint64
	health []byte
}

// healthBufs holds the buffers replyMeta.health is encoded in (growing
// one from nothing took four allocations per answer).
var healthBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// handleNATS serves a request that came by NATS.
func (c *cluster) handleNATS(m *nats.Msg) {
	subj := m.Subject
	op := subj[strings.LastIndexByte(subj, '.')+1:]
	rest := strings.TrimSuffix(strings.TrimPrefix(subj, c.prefix+".tab."), "."+op)
	c.exec(op, kvrep.Unkey(rest), m.Header.Get(hdrAdmit) != "", m.Data, func(b []byte, err error, meta *replyMeta, _ bool) {
		switch {
		case err != nil:
			_ = m.Respond(errReply(err, false))
		case meta == nil:
			out := getReply(b)
			_ = m.Respond(*out)
			putReply(out)
		default:
			out := getReply(b)
			h := nats.Header{hdrGen: []string{strconv.FormatUint(meta.gen, 10)}, hdrHealth: []string{string(meta.health)}}
			if c.peer != nil {
				pi := c.peer.info
				v := pi.Node + " " + pi.Addr + " " + pi.Key
				if pi.Cert != "" {
					v += " " + pi.Cert
				}
				h[hdrPeer] = []string{v}
				if pi.Net != "" {
					h[hdrPeerNet] = []string{pi.Net}
				}
			}
			_ = m.RespondMsg(&nats.Msg{Data: *out, Header: h})
			putReply(out)
		}
	})
}

// handlePeer serves a request that came on the peer link.
func (c *cluster) handlePeer(pr *peerReq) {
	body := pr.body // aliases the connection's pooled read buffer
	if pr.op == "push" || pr.op == "append" || pr.op == "logpush" {
		body = append([]byte(nil), body...) // kept past the request (send queue, log ring)
	}
	c.exec(pr.op, pr.tid, pr.admit, body, func(b []byte, err error, meta *replyMeta, notHere bool) {
		switch {
		case notHere:
			pr.answer('0', nil, true, nil)
		case err != nil:
			e := errReply(err, false)
			pr.answer(e[0], e[1:], false, nil)
		default:
			pr.answer('0', b, false, meta)
		}
	})
}

// exec serves one request from another node against the local registry and
// answers it once through ans: a payload, an error, or (notHere, with
// ErrPaused) nothing done because the tab is not on this node. meta is set
// on a payload when the request carried its admit (the requester keeps
// "paired" fresh from it: see DeferAdmit). data may alias a buffer reused
// after exec returns: only push, logpush and append keep it, and get a copy.
func (c *cluster) exec(op, tid string, admit bool, data []byte, ans func(b []byte, err error, meta *replyMeta, notHere bool)) {
	c.served.Add(1)
	r := c.r
	var req callReq
	if len(data) > 0 && op != "push" && op != "append" { // those carry a frame, not a callReq
		if err := decodeCallReq(data, &req); err != nil {
			ans(nil, errors.New("bad request"), nil, false)
			return
		}
	}
	ctx := context.Background()
	if req.WaitMs > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.WaitMs)*time.Millisecond)
		defer cancel()
	}
	if req.RID != "" {
		ctx = audit.WithRequestID(ctx, req.RID)
	}
	respond := func(b []byte, err error) {
		if err != nil || !admit {
			ans(b, err, nil, false)
			return
		}
		hb := healthBufs.Get().(*[]byte)
		meta := &replyMeta{gen: r.helloGen(tid), health: r.Health(tid).AppendJSON((*hb)[:0])}
		ans(b, nil, meta, false)
		if cap(meta.health) <= 4<<10 {
			*hb = meta.health[:0]
			healthBufs.Put(hb)
		}
	}
	if !r.holds(tid) && op != "unregister" {
		ans(nil, ErrPaused, nil, true)
		return
	}
	if admit {
		// The request's deferred admit: the per-tid rate limit, before
		// anything reaches the tab.
		if h := r.hooks.Load(); h.OnAdmit != nil {
			if ok, ms := h.OnAdmit(tid); !ok {
				respond(nil, &RateLimitError{RetryAfterMs: max(ms, 1)})
				return
			}
		}
	}
	switch op {
	case "admit":
		a := admitReply{Paired: true, OK: true}
		if !req.Probe {
			if h := r.hooks.Load(); h.OnAdmit != nil {
				a.OK, a.RetryMs = h.OnAdmit(tid)
			}
		}
		a.Gen, a.Health = r.helloGen(tid), r.Health(tid)
		if c.peer != nil {
			a.Peer = &c.peer.info
		}
		b, _ := json.Marshal(a)
		respond(b, nil)
	case "hello":
		h, ok := r.Hello(tid)
		var hp *Hello
		if ok {
			hp = &h
		}
		b, _ := json.Marshal(struct {
			Gen   uint64 `json:"gen"`
			Hello *Hello `json:"hello"`
		}{r.helloGen(tid), hp})
		respond(b, nil)
	case "health":
		b, _ := json.Marshal(r.Health(tid))
		respond(b, nil)
	case "call":
		// The answer is copied at most once, from the read buffer into
		// the reply (the peer link writes it from there).
		res, err := r.CallReply(ctx, tid, req.Tool, req.Args, time.Duration(req.TimeoutMs)*time.Millisecond)
		respond(res.Data, err)
		res.Release()
	case "watch":
		res, err := r.Watch(ctx, tid, req.Path)
		respond(res, err)
	case "push":
		respond(nil, r.Push(tid, json.RawMessage(data)))
	case "logpush":
		r.ExpectLog(tid, req.Expect)
		respond(nil, r.Push(tid, req.Args))
	case "log":
		b, _ := json.Marshal(r.RecentLog(tid, req.N, req.Kind))
		respond(b, nil)
	case "append":
		respond(nil, r.AppendLog(tid, json.RawMessage(data)))
	case "expect":
		r.ExpectLog(tid, req.Expect)
		respond(nil, nil)
	case "unregister":
		r.Unregister(tid)
		respond(nil, nil)
	default:
		respond(nil, errors.New(unknownOp+strconv.Quote(op)))
	}
}

// Stats returns the forwarder's counters.
func (c *cluster) stats() ClusterStats {
	c.mu.Lock()
	owned := len(c.subs)
	c.mu.Unlock()
	st := ClusterStats{Forwarded: c.forwarded.Load(), NoResponders: c.noResponders.Load(),
		Failures: c.failures.Load(), Served: c.served.Load(), Owned: owned,
		Reannounced: c.reasserts.Load(), TakeoversRefused: c.staleTakeovers.Load()}
	if l := c.peer; l != nil {
		st.Direct, st.Fallbacks, st.PeerRefused = l.sent.Load(), l.fallback.Load(), l.refusals.Load()
	}
	return st
}

// marshalArgs turns Call's args into JSON bytes (json.RawMessage as is).
func marshalArgs(args any) (json.RawMessage, error) {
	switch v := args.(type) {
	case json.RawMessage:
		return v, nil
	case nil:
		return nil, nil
	}
	return json.Marshal(args)
}

// health returns tid's health from the last admit (fresh for a second), or
// asks the owner.
func (c *cluster) health(tid string) (Health, bool) {
	c.mu.Lock()
	if e := c.remote[tid]; e != nil && time.Since(e.at) < remoteFresh {
		h := e.health
		c.mu.Unlock()
		return h, true
	}
	c.mu.Unlock()
	b, err := c.simple(tid, "health", nil)
	if err != nil {
		return Health{}, false
	}
	var h Health
	if json.Unmarshal(b, &h) != nil {
		return Health{}, false
	}
	return h, true
}
