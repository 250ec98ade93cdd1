package pairing

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lapd-dev/lapd/audit"
)

// # The peer link (Config.PeerListen)
//
// A forwarded request crosses NATS as two messages through nats-server:
// measured on one machine that leg (the server process, nats.go's goroutine
// hand-offs and copies) cost more CPU than the node's own work for the
// call, and half the throughput. So a node may also listen on a TCP
// address of its own, and a node that forwards to it sends its requests
// there directly, on one multiplexed connection per pair of nodes. NATS
// stays what it was for everything else: it finds a tab's owner (the
// owner's admit reply names its peer address), carries takeover, the KV
// buckets and the audit stream, and carries the request itself whenever
// the link cannot: no address known yet, a dial or handshake that failed
// (then not retried for peerRetry), or an owner that no longer holds the
// tab ("moved": nothing was done there; the request goes by NATS, whose
// queue subscription reaches whichever node holds it now).
//
// The request and reply bodies are those of the NATS path, so the owner
// serves both with the same code (exec), with the same deadlines and the
// same one answer per request. A connection lost with a request on it is
// the link's only new failure: a call then is in doubt (the owner may
// have sent the frame), exactly as a NATS call whose reply never came,
// and anything else is ErrPaused.
//
// Why not a library: net/rpc starts a goroutine per request and cannot
// lend a reply's buffer to the caller; gRPC would bring HTTP/2 framing and
// a large dependency for two message shapes. The framing below is
// length-prefixed binary, read through one buffered reader per connection.
//
// Authentication: each node draws a random 32-byte key at start and
// publishes it only in its admit replies, on NATS (the cluster's trust
// root: whoever may read those may already forward calls). A connection
// begins with a challenge-response in both directions (HMAC-SHA256 of both
// sides' nonces under the key): the key never crosses the link, a client
// without it is refused (audited as auth-failed, endpoint "peer-link")
// before any request is read, and a process that took over the address
// cannot pass as the node. The link is not encrypted: the default listens
// on 127.0.0.1 (nodes on one machine); across machines use it only on a
// private network (docs/CLUSTER.md), or turn it off and NATS (with TLS)
// carries everything.
//
// Frames (big-endian):
//
//	request  u32 n | u32 id | u8 flags (1 = admit) | u8 len(op) | op | u16 len(tid) | tid | body
//	reply    u32 n | u32 id | u8 kind (0 = body, 1 = moved) | u8 meta | [u64 gen | u16 len(health) | health] | body
//
// n counts the bytes after itself.

const (
	peerProto      = "LAPDPEER1"
	peerHandshake  = 3 * time.Second  // dial + both handshake lines
	peerRetry      = 5 * time.Second  // after a failed dial or handshake
	peerWrite      = 10 * time.Second // a write to a peer that does not read
	peerMaxConns   = 256              // inbound connections per node
	peerMaxPending = 4096             // requests a connection may have in flight
	peerDrain      = 2 * time.Second  // Shutdown: replies in flight may finish
)

// errMoved: the peer does not hold the tab (and did nothing); errNoLink:
// nothing was sent. Both send the request by NATS instead.
var (
	errMoved  = errors.New("pairing: peer: the tab is not on that node")
	errNoLink = errors.New("pairing: peer: no link")
)

// errLinkLost: the connection ended with the request sent and unanswered.
var errLinkLost = errors.New("pairing: peer: the connection to the tab's node was lost")

// peerInfo is what an owner's admit reply says about its link.
type peerInfo struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
	Key  string `json:"key"` // hex
}

// peerLink is a node's side of the link: its listener and its connections
// to other nodes.
type peerLink struct {
	c    *cluster
	ln   net.Listener
	info peerInfo
	key  []byte

	mu       sync.Mutex
	peers    map[string]*peer // by node
	inbound  map[net.Conn]struct{}
	draining bool // Shutdown: no request read from now on is served
	closed   bool

	inflight                 sync.WaitGroup // requests served here, until their reply is written (Add under mu, before draining)
	sent, fallback, refusals atomic.Int64
	loggedRefusal            atomic.Int64 // unix ns of the last refusal logged
}

func newPeerLink(c *cluster, listen, advertise string) (*peerLink, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("pairing: peer link: listening on %s: %w", listen, err)
	}
	addr := advertise
	if addr == "" {
		a := ln.Addr().(*net.TCPAddr)
		if a.IP.IsUnspecified() {
			_ = ln.Close()
			return nil, fmt.Errorf("pairing: peer link: %s listens on every interface; say which address the other nodes dial (PeerAdvertise, --peer-advertise)", listen)
		}
		addr = a.String()
	} else if _, _, err := net.SplitHostPort(addr); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("pairing: peer link: advertise address %q: %w", advertise, err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	l := &peerLink{c: c, ln: ln, key: key, info: peerInfo{Node: c.node, Addr: addr, Key: hex.EncodeToString(key)},
		peers: map[string]*peer{}, inbound: map[net.Conn]struct{}{}}
	c.r.wg.Add(2)
	go l.accept()
	go l.closer()
	return l, nil
}

// Addr is the address the link listens on.
func (l *peerLink) Addr() net.Addr { return l.ln.Addr() }

// closer ends the link when the Registry shuts down: no new connections,
// replies in flight written (bounded by peerDrain), then every connection
// closed.
func (l *peerLink) closer() {
	defer l.c.r.wg.Done()
	<-l.c.r.stop
	_ = l.ln.Close()
	l.mu.Lock()
	l.draining = true
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(peerDrain):
	}
	l.mu.Lock()
	l.closed = true
	in := l.inbound
	l.inbound = map[net.Conn]struct{}{}
	peers := l.peers
	l.mu.Unlock()
	for nc := range in {
		_ = nc.Close()
	}
	for _, p := range peers {
		p.mu.Lock() // a dial under way finishes first, and is seen here
		pc := p.conn
		p.mu.Unlock()
		if pc != nil {
			pc.fail(ErrPaused)
		}
	}
}

// learn records what an admit reply said about the owner's link and
// returns the peer to send tid's requests to (nil: by NATS).
func (l *peerLink) learn(pi *peerInfo) *peer {
	if pi == nil || pi.Node == "" || pi.Node == l.info.Node {
		return nil
	}
	key, err := hex.DecodeString(pi.Key)
	if err != nil || len(key) != 32 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	p := l.peers[pi.Node]
	if p != nil && p.addr == pi.Addr && hmac.Equal(p.key, key) {
		return p
	}
	if p != nil { // the node came back with another address or key
		p.mu.Lock()
		pc := p.conn
		p.conn = nil
		p.mu.Unlock()
		if pc != nil {
			pc.fail(ErrPaused)
		}
	}
	if len(l.peers) >= maxRemote {
		for k := range l.peers { // nodes come and go: forget one
			delete(l.peers, k)
			break
		}
	}
	p = &peer{l: l, node: pi.Node, addr: pi.Addr, key: key}
	l.peers[pi.Node] = p
	return p
}

// --- the requesting side ---

// peer is another node as this node's requests see it.
type peer struct {
	l    *peerLink
	node string
	addr string
	key  []byte

	mu       sync.Mutex // held while dialling
	conn     *peerConn
	badUntil time.Time
}

// peerConn is one connection to a peer, shared by every request to it.
type peerConn struct {
	nc  net.Conn
	wmu sync.Mutex // one frame written at a time

	mu       sync.Mutex
	next     uint32
	waiting  map[uint32]chan peerAnswer
	err      error        // set once: the connection is gone
	lastRead atomic.Int64 // unix ns of the last answer read
}

type peerAnswer struct {
	buf    *bytes.Buffer // holds body (pooled read buffer)
	body   []byte        // '0' + payload, or '1' + wireErr
	moved  bool
	meta   bool
	gen    uint64
	health []byte
	err    error
}

// get returns a live connection to p, dialling one if needed; nil when the
// peer cannot be reached now (the request goes by NATS).
func (p *peer) get() *peerConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc := p.conn; pc != nil {
		pc.mu.Lock()
		ok := pc.err == nil
		pc.mu.Unlock()
		if ok {
			return pc
		}
		p.conn = nil
	}
	if time.Now().Before(p.badUntil) {
		return nil
	}
	pc, err := p.dial()
	if err != nil {
		p.badUntil = time.Now().Add(peerRetry)
		p.l.c.r.cfg.Logger.Warn("pairing: peer link: cannot reach a node directly; its requests go by NATS", "node", p.node, "addr", p.addr, "err", err)
		return nil
	}
	p.conn = pc
	return pc
}

func (p *peer) dial() (*peerConn, error) {
	nc, err := net.DialTimeout("tcp", p.addr, peerHandshake)
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(peerHandshake))
	br := bufio.NewReaderSize(nc, 32<<10)
	if err := clientHandshake(nc, br, p.node, p.key); err != nil {
		_ = nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	pc := &peerConn{nc: nc, waiting: map[uint32]chan peerAnswer{}}
	r := p.l.c.r
	r.mu.Lock()
	shutting := r.shutting
	if !shutting {
		r.wg.Add(1)
	}
	r.mu.Unlock()
	if shutting {
		_ = nc.Close()
		return nil, ErrClosed
	}
	go pc.readLoop(br, r)
	return pc, nil
}

// clientHandshake: → "LAPDPEER1 <node> <cnonce>\n"; ← "<snonce> <proof>\n",
// proof = HMAC(key, "s" cnonce snonce); → "<proof>\n", HMAC(key, "c" cnonce
// snonce); ← "ok\n".
func clientHandshake(w io.Writer, br *bufio.Reader, node string, key []byte) error {
	cn := nonce()
	if _, err := io.WriteString(w, peerProto+" "+node+" "+cn+"\n"); err != nil {
		return err
	}
	line, err := readLine(br)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	sn, proof, ok := strings.Cut(line, " ")
	if !ok || !hmac.Equal([]byte(proof), []byte(mac(key, "s", cn, sn))) {
		return errors.New("handshake: the node at that address does not hold the key its admit published")
	}
	if _, err := io.WriteString(w, mac(key, "c", cn, sn)+"\n"); err != nil {
		return err
	}
	line, err = readLine(br)
	if err != nil || line != "ok" {
		return fmt.Errorf("handshake: refused (%q, %v)", line, err)
	}
	return nil
}

func nonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func mac(key []byte, side, cn, sn string) string {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(side + " " + cn + " " + sn))
	return hex.EncodeToString(h.Sum(nil))
}

// readLine reads one handshake line of at most 256 bytes.
func readLine(br *bufio.Reader) (string, error) {
	var b []byte
	for {
		c, err := br.ReadByte()
		if err != nil {
			return "", err
		}
		if c == '\n' {
			return string(b), nil
		}
		if len(b) >= 256 {
			return "", errors.New("handshake line too long")
		}
		b = append(b, c)
	}
}

// fail ends the connection: every waiting request gets err.
func (pc *peerConn) fail(err error) {
	pc.mu.Lock()
	if pc.err != nil {
		pc.mu.Unlock()
		return
	}
	pc.err = err
	w := pc.waiting
	pc.waiting = nil
	pc.mu.Unlock()
	_ = pc.nc.Close()
	for _, ch := range w {
		ch <- peerAnswer{err: err}
	}
}

func (pc *peerConn) readLoop(br *bufio.Reader, r *Registry) {
	defer r.wg.Done()
	max := uint32(r.cfg.MaxFrame) + 1<<20
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			pc.fail(errLinkLost)
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < 6 || n > max {
			pc.fail(errLinkLost)
			return
		}
		buf := bufPool.Get().(*bytes.Buffer)
		buf.Reset()
		buf.Grow(int(n))
		b := buf.Bytes()[:n] // within the capacity Grow made; buf's length stays 0
		if _, err := io.ReadFull(br, b); err != nil {
			putReadBuf(buf)
			pc.fail(errLinkLost)
			return
		}
		a, id, ok := parseAnswer(b)
		if !ok {
			putReadBuf(buf)
			pc.fail(errLinkLost)
			return
		}
		a.buf = buf
		pc.lastRead.Store(time.Now().UnixNano())
		pc.mu.Lock()
		ch := pc.waiting[id]
		delete(pc.waiting, id)
		pc.mu.Unlock()
		if ch == nil { // its requester gave up
			putReadBuf(buf)
			continue
		}
		ch <- a
	}
}

func parseAnswer(b []byte) (a peerAnswer, id uint32, ok bool) {
	id = binary.BigEndian.Uint32(b)
	kind, meta := b[4], b[5]
	b = b[6:]
	if meta == 1 {
		if len(b) < 10 {
			return a, 0, false
		}
		a.meta, a.gen = true, binary.BigEndian.Uint64(b)
		hl := int(binary.BigEndian.Uint16(b[8:]))
		b = b[10:]
		if len(b) < hl {
			return a, 0, false
		}
		a.health, b = b[:hl], b[hl:]
	}
	switch kind {
	case 0:
		a.body = b
	case 1:
		a.moved = true
	default:
		return a, 0, false
	}
	return a, id, true
}

var answerChans = sync.Pool{New: func() any { return make(chan peerAnswer, 1) }}

// request sends one request and waits for its answer. errNoLink and
// errMoved mean nothing was done (send it by NATS); errLinkLost means it
// was sent and not answered. The caller releases the answer's buf.
func (p *peer) request(ctx context.Context, op, tid string, admit bool, body []byte) (peerAnswer, error) {
	pc := p.get()
	if pc == nil {
		return peerAnswer{}, errNoLink
	}
	ch := answerChans.Get().(chan peerAnswer)
	pc.mu.Lock()
	if pc.err != nil || len(pc.waiting) >= peerMaxPending {
		pc.mu.Unlock()
		answerChans.Put(ch)
		return peerAnswer{}, errNoLink
	}
	pc.next++
	id := pc.next
	pc.waiting[id] = ch
	pc.mu.Unlock()

	n := 4 + 1 + 1 + len(op) + 2 + len(tid) + len(body)
	fb := getFrameBuf(4 + n)
	f := binary.BigEndian.AppendUint32((*fb)[:0], uint32(n))
	f = binary.BigEndian.AppendUint32(f, id)
	flags := byte(0)
	if admit {
		flags = 1
	}
	f = append(f, flags, byte(len(op)))
	f = append(f, op...)
	f = binary.BigEndian.AppendUint16(f, uint16(len(tid)))
	f = append(f, tid...)
	f = append(f, body...)
	pc.wmu.Lock()
	_ = pc.nc.SetWriteDeadline(time.Now().Add(peerWrite))
	wrote, err := pc.nc.Write(f)
	pc.wmu.Unlock()
	*fb = f
	putFrameBuf(fb)
	if err != nil {
		pc.fail(errLinkLost)
		a := <-ch // fail answered every waiter, or the reader did first
		if wrote == 0 && a.err != nil {
			answerChans.Put(ch)
			return peerAnswer{}, errNoLink
		}
		answerChans.Put(ch)
		if a.err == nil {
			return a, nil
		}
		return peerAnswer{}, errLinkLost
	}
	p.l.sent.Add(1)
	sentAt := time.Now().UnixNano()
	select {
	case a := <-ch:
		answerChans.Put(ch)
		if a.err != nil {
			return peerAnswer{}, errLinkLost
		}
		if a.moved {
			putReadBuf(a.buf)
			return peerAnswer{}, errMoved
		}
		return a, nil
	case <-ctx.Done():
		pc.mu.Lock()
		_, mine := pc.waiting[id]
		delete(pc.waiting, id)
		pc.mu.Unlock()
		if !mine { // the answer (or the failure) is on its way: take it
			a := <-ch
			if a.buf != nil {
				putReadBuf(a.buf)
			}
		}
		answerChans.Put(ch)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) && pc.lastRead.Load() < sentAt {
			// Nothing came back on this connection while the request
			// waited: the peer may be gone without a reset (a machine
			// that lost power). The next request dials again, and goes by
			// NATS if that fails, rather than wait here for TCP to notice.
			pc.fail(errLinkLost)
		}
		return peerAnswer{}, ctx.Err()
	}
}

var frameBufs sync.Pool

func getFrameBuf(n int) *[]byte {
	p, _ := frameBufs.Get().(*[]byte)
	if p == nil || cap(*p) < n {
		b := make([]byte, 0, max(n, 512))
		return &b
	}
	return p
}

func putFrameBuf(p *[]byte) {
	if cap(*p) <= maxPooledReply {
		frameBufs.Put(p)
	}
}

// --- the serving side ---

func (l *peerLink) accept() {
	defer l.c.r.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		l.mu.Lock()
		if l.closed || len(l.inbound) >= peerMaxConns {
			l.mu.Unlock()
			_ = nc.Close()
			continue
		}
		l.inbound[nc] = struct{}{}
		l.c.r.wg.Add(1)
		l.mu.Unlock()
		go l.serveConn(nc)
	}
}

// serverHandshake is clientHandshake's other side.
func (l *peerLink) serverHandshake(nc net.Conn, br *bufio.Reader) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != peerProto {
		return errors.New("not a lapd peer")
	}
	if f[1] != l.info.Node {
		return errors.New("the client asked for node " + strconv.Quote(f[1]))
	}
	cn, sn := f[2], nonce()
	if _, err := io.WriteString(nc, sn+" "+mac(l.key, "s", cn, sn)+"\n"); err != nil {
		return err
	}
	proof, err := readLine(br)
	if err != nil {
		return err
	}
	if !hmac.Equal([]byte(proof), []byte(mac(l.key, "c", cn, sn))) {
		return errors.New("bad proof of the key")
	}
	_, err = io.WriteString(nc, "ok\n")
	return err
}

// serverConn is an inbound connection: requests are read here and served
// on the cluster's workers; their replies are written under wmu.
type serverConn struct {
	l   *peerLink
	nc  net.Conn
	wmu sync.Mutex
	sem chan struct{} // requests in flight on this connection
}

func (l *peerLink) serveConn(nc net.Conn) {
	defer l.c.r.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.inbound, nc)
		l.mu.Unlock()
		_ = nc.Close()
	}()
	_ = nc.SetDeadline(time.Now().Add(peerHandshake))
	br := bufio.NewReaderSize(nc, 16<<10)
	if err := l.serverHandshake(nc, br); err != nil {
		l.refusals.Add(1)
		ip, _, _ := net.SplitHostPort(nc.RemoteAddr().String())
		if now, last := time.Now().UnixNano(), l.loggedRefusal.Load(); now-last > int64(time.Second) && l.loggedRefusal.CompareAndSwap(last, now) {
			l.c.r.cfg.Logger.Warn("pairing: peer link: refused a connection (at most one such line a second; each is audited)", "remote", nc.RemoteAddr().String(), "err", err)
		}
		l.c.r.cfg.Audit.Record(context.Background(), audit.Entry{Event: audit.EventAuthFailed,
			Detail: map[string]any{"endpoint": "peer-link", "ip": ip, "reason": err.Error()}})
		return
	}
	_ = nc.SetDeadline(time.Time{})
	sc := &serverConn{l: l, nc: nc, sem: make(chan struct{}, peerMaxPending)}
	max := uint32(l.c.r.cfg.MaxFrame) + 1<<20
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n < 8 || n > max {
			return
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return
		}
		pr, ok := parseRequest(b)
		if !ok {
			return
		}
		pr.sc = sc
		sc.sem <- struct{}{} // back-pressure: stop reading at peerMaxPending
		l.mu.Lock()
		if l.draining { // nothing done: the requester goes by NATS
			l.mu.Unlock()
			pr.write(0, nil, true, nil)
			<-sc.sem
			continue
		}
		l.inflight.Add(1)
		l.mu.Unlock()
		l.c.dispatch(job{p: pr})
	}
}

// peerReq is one request read from a serverConn.
type peerReq struct {
	sc    *serverConn
	id    uint32
	admit bool
	op    string
	tid   string
	body  []byte
}

func parseRequest(b []byte) (*peerReq, bool) {
	pr := &peerReq{id: binary.BigEndian.Uint32(b), admit: b[4]&1 != 0}
	ol := int(b[5])
	b = b[6:]
	if len(b) < ol+2 {
		return nil, false
	}
	pr.op, b = string(b[:ol]), b[ol:]
	tl := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if len(b) < tl {
		return nil, false
	}
	pr.tid, pr.body = string(b[:tl]), b[tl:]
	return pr, true
}

// leads holds the first byte of a reply body ('0' ok, '1' error), written
// from here so that a payload goes out from where it lies.
var leads = [2]byte{'0', '1'}

// answer writes pr's reply (see write), the request's end.
func (pr *peerReq) answer(lead byte, body []byte, moved bool, meta *replyMeta) {
	pr.write(lead, body, moved, meta)
	<-pr.sc.sem
	pr.sc.l.inflight.Done()
}

// write writes a reply: lead + body, or, when moved, no body.
func (pr *peerReq) write(lead byte, body []byte, moved bool, meta *replyMeta) {
	sc := pr.sc
	var hb [4 + 4 + 2 + 8 + 2]byte
	h := hb[:4]
	h = binary.BigEndian.AppendUint32(h, pr.id)
	kind := byte(0)
	if moved {
		kind = 1
	}
	var health []byte
	if meta != nil {
		h = append(h, kind, 1)
		h = binary.BigEndian.AppendUint64(h, meta.gen)
		health = meta.health
		if len(health) > 0xffff {
			health = nil
		}
		h = binary.BigEndian.AppendUint16(h, uint16(len(health)))
	} else {
		h = append(h, kind, 0)
	}
	var l []byte
	if !moved {
		l = leads[:1]
		if lead == '1' {
			l = leads[1:]
		}
	} else {
		body = nil
	}
	binary.BigEndian.PutUint32(h, uint32(len(h)-4+len(health)+len(l)+len(body)))
	bufs := net.Buffers{h, health, l, body}
	sc.wmu.Lock()
	_ = sc.nc.SetWriteDeadline(time.Now().Add(peerWrite))
	_, err := bufs.WriteTo(sc.nc)
	sc.wmu.Unlock()
	if err != nil {
		_ = sc.nc.Close() // the reader ends; the requester sees the link lost
	}
}
