package pairing

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/clientip"
	"github.com/lapd-dev/lapd/internal/hostguard"
)

// # The peer link (Config.PeerListen)
//
// A forwarded request crosses NATS as two messages through nats-server:
// measured on one machine that leg (the server process, nats.go's goroutine
// hand-offs and copies) cost more CPU than the node's own work for the
// call, and half the throughput. So a node may also listen on a TCP
// address of its own, and a node that forwards to it sends its requests
// there directly, on connections it keeps to that node. NATS
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
// One request at a time per connection, as HTTP/1.1 keep-alive: the
// requesting goroutine writes its request and reads the answer itself, and
// the owner's goroutine for the connection reads a request, serves it and
// writes the answer, so a forwarded call adds no hand-off between
// goroutines on either side (a first version multiplexed one connection
// per pair of nodes through a reader goroutine on each side; each hand-off
// can cost a futex wake on a machine with idle CPUs). An idle connection
// is peeked (without waiting) before it is used, so one the owner closed
// meanwhile is not written on; an answer that has not come peerLate after
// the caller's deadline (which the owner keeps itself) marks the node
// unreachable for peerRetry (a machine gone without a reset). A
// node opens connections to a peer as its requests run concurrently (at
// most peerMaxConns; beyond that, NATS) and keeps them open when idle: all
// of them while they were used within peerIdleTTL, peerIdle past that (a
// connection dropped after each request would cost a dial and a handshake
// per call whenever more than peerIdle run at once).
//
// Why not a library: net/rpc multiplexes (the hand-offs above) and cannot
// lend the reply's buffer to the caller; gRPC brings HTTP/2 framing and a
// large dependency for two message shapes; net/http would parse and write
// headers the link does not need, on both sides of every call.
//
// Authentication: each node draws a random 32-byte key at start and
// publishes it only in its admit replies, on NATS (the cluster's trust
// root: whoever may read those may already forward calls). A connection
// begins with a challenge-response in both directions (HMAC-SHA256 of both
// sides' nonces under the key): the key never crosses the link, a client
// without it is refused (audited as auth-failed, endpoint "peer-link")
// before any request is read, and a process that took over the address
// cannot pass as the node.
//
// Encryption (Config.PeerTLS): unless the address other nodes dial is a
// loopback one, the listener speaks TLS 1.3 with a certificate the node
// makes for itself at start (ECDSA P-256, never written anywhere) and
// publishes the SHA-256 of next to the key: a requester pins that
// fingerprint instead of checking a chain, so no certificate authority is
// needed and an impostor at the address fails before the challenge. The
// challenge-response then runs inside TLS as before. On loopback the link
// stays plain TCP (the traffic never leaves the machine; TLS would cost
// CPU on the hot path for nothing); PeerTLS "on" or "off" overrides.
// Session tickets are off: a ticket arriving on an idle connection would
// look like data to the idle check.
//
// Frames (big-endian):
//
//	request  u32 n | u8 flags (1 = admit) | u8 len(op) | op | u16 len(tid) | tid | body
//	reply    u32 n | u8 kind (0 = body, 1 = moved) | u8 meta | [u64 gen | u16 len(health) | health] | body
//
// n counts the bytes after itself.

const (
	peerProto     = "LAPDPEER2"
	peerHandshake = 3 * time.Second  // dial + both handshake lines
	peerRetry     = 5 * time.Second  // after a failed dial or handshake
	peerWrite     = 10 * time.Second // a write to a peer that does not read
	peerInbound   = 1024             // inbound connections per node
	peerConnBurst = peerInbound      // new inbound connections from one address at once (nodes on one machine share one)…
	peerConnRate  = 50               // …then this many a second
	peerMaxConns  = 256              // connections to one peer (requests in flight to it)
	peerIdle      = 32               // idle connections kept per peer for good…
	peerIdleTTL   = 10 * time.Second // …and more while used within this
	peerDrain     = 2 * time.Second  // Shutdown: replies in flight may finish
	peerLate      = time.Second      // an answer this late after the caller's deadline: the peer is gone
	peerLogEvery  = 10 * time.Minute // a node that stays unreachable is logged again this often

	// A machine that is gone without a reset (power lost, cable cut,
	// partition) leaves its connections open on this side. TCP finds it
	// out: keep-alive probes after peerKeepIdle of silence, every
	// peerKeepEvery, and (Linux) TCP_USER_TIMEOUT ends a connection whose
	// probes or data go unacknowledged for peerUserTimeout. So a request
	// waiting on such a node ends in about peerKeepIdle+peerUserTimeout
	// (not at its deadline, which for a long poll is a minute), an idle
	// connection to it is closed before a request is written on it, and
	// the serving side does not keep a dead requester's connections.
	peerKeepIdle    = 5 * time.Second
	peerKeepEvery   = time.Second
	peerUserTimeout = 5 * time.Second
)

// peerKeepAlive is the keep-alive of every peer-link connection (above).
var peerKeepAlive = net.KeepAliveConfig{Enable: true, Idle: peerKeepIdle, Interval: peerKeepEvery, Count: int(peerUserTimeout / peerKeepEvery)}

// errMoved: the peer does not hold the tab (and did nothing); errNoLink:
// nothing was sent. Both send the request by NATS instead.
var (
	errMoved  = errors.New("pairing: peer: the tab is not on that node")
	errNoLink = errors.New("pairing: peer: no link")
)

// ErrLinkLost: the connection to the tab's node (the peer link, between
// cluster nodes) ended with a request sent and unanswered: that node
// stopped, or its machine or the network to it is gone. A request that
// fails so also fails with ErrPaused (the tab re-pairs elsewhere), and a
// Call with ErrOutcomeUnknown.
var ErrLinkLost = errors.New("pairing: peer: the connection to the tab's node was lost")

// peerInfo is what an owner's admit reply says about its link.
type peerInfo struct {
	Node string `json:"node"`
	Addr string `json:"addr"`
	Key  string `json:"key"`            // hex
	Cert string `json:"cert,omitempty"` // hex SHA-256 of the listener's TLS certificate; "" = plain TCP
	Net  string `json:"net,omitempty"`  // the node's network namespace (netID); "" = unknown
}

// peerLink is a node's side of the link: its listener and its connections
// to other nodes.
type peerLink struct {
	c    *cluster
	ln   net.Listener
	info peerInfo
	key  []byte
	tls  *tls.Config // the listener's, nil = plain TCP

	mu       sync.Mutex
	peers    map[string]*peer // by node
	inbound  map[net.Conn]struct{}
	perIP    map[string]*connBucket // new inbound connections by remote address
	draining bool                   // Shutdown: no request read from now on is served
	closed   bool

	elsewhere map[string]bool // nodes whose loopback link is in another network namespace (logged once each)

	inflight                 sync.WaitGroup // requests served here, until their reply is written (Add under mu, before draining)
	sent, fallback, refusals atomic.Int64
	loggedRefusal            atomic.Int64 // unix ns of the last refusal logged
}

func newPeerLink(c *cluster, listen, advertise, tlsMode string) (*peerLink, error) {
	lc := net.ListenConfig{KeepAliveConfig: peerKeepAlive} // (applied to each accepted connection)
	ln, err := lc.Listen(context.Background(), "tcp", listen)
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
	useTLS, err := peerTLSOn(tlsMode, addr)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	l := &peerLink{c: c, ln: ln, key: key, info: peerInfo{Node: c.node, Addr: addr, Key: hex.EncodeToString(key), Net: netID()},
		peers: map[string]*peer{}, inbound: map[net.Conn]struct{}{}, perIP: map[string]*connBucket{}, elsewhere: map[string]bool{}}
	if useTLS {
		cert, sum, err := selfSigned(c.node)
		if err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("pairing: peer link: making its TLS certificate: %w", err)
		}
		l.info.Cert = hex.EncodeToString(sum)
		l.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13, SessionTicketsDisabled: true}
	}
	c.r.cfg.Logger.Info("cluster peer link: other nodes send calls for tabs held here directly", "listen", ln.Addr().String(), "advertise", addr, "tls", useTLS)
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
		p.close() // idle connections; one in use is closed when its request ends
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
	var cert []byte
	if pi.Cert != "" {
		if cert, err = hex.DecodeString(pi.Cert); err != nil || len(cert) != sha256.Size {
			return nil
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if pi.Net != "" && l.info.Net != "" && pi.Net != l.info.Net && hostguard.IsLoopbackName(hostguard.Name(pi.Addr)) {
		// Its 127.0.0.1 is not ours (another machine, or another network
		// namespace on this one): dialling it would reach whatever listens
		// on that port here, this node's own link included. NATS carries
		// its requests, as the docs promise when --peer-listen is left.
		if !l.elsewhere[pi.Node] && len(l.elsewhere) < maxRemote {
			l.elsewhere[pi.Node] = true
			l.c.r.cfg.Logger.Info("cluster peer link: a node's link listens on loopback on another machine (or network namespace); calls for its tabs go by NATS. To send them directly, start it with --peer-listen on an address this node reaches", "node", pi.Node, "addr", pi.Addr)
		}
		return nil
	}
	p := l.peers[pi.Node]
	if p != nil && p.addr == pi.Addr && hmac.Equal(p.key, key) && bytes.Equal(p.cert, cert) {
		return p
	}
	if p != nil { // the node came back with another address, key or certificate
		p.close()
	}
	if len(l.peers) >= maxRemote {
		for k, old := range l.peers { // nodes come and go: forget one
			delete(l.peers, k)
			old.close()
			break
		}
	}
	p = &peer{l: l, node: pi.Node, addr: pi.Addr, key: key, cert: cert}
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
	cert []byte // SHA-256 of its TLS certificate; nil = plain TCP

	mu       sync.Mutex
	idle     []*peerConn // most recently used last
	open     int         // connections open, idle or in use (and dials under way)
	badUntil time.Time
	failing  time.Time // since when dials fail (zero: the last one worked)
	loggedAt time.Time // the last dial failure logged
	gone     bool      // the node changed address or key, or the link closed
}

// peerConn is one connection to a peer, used by one request at a time.
type peerConn struct {
	nc   net.Conn // raw, or TLS over raw
	raw  net.Conn // the TCP connection
	br   *bufio.Reader
	used time.Time // when it was last put back idle
}

type peerAnswer struct {
	buf    *bytes.Buffer // holds body (pooled read buffer)
	body   []byte        // '0' + payload, or '1' + wireErr
	moved  bool
	meta   bool
	gen    uint64
	health []byte
}

// take returns a connection for one request: an idle one that is still
// open, or a new one; nil when the peer cannot be reached now (the request
// goes by NATS).
func (p *peer) take() *peerConn {
	p.mu.Lock()
	for len(p.idle) > 0 {
		pc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		p.mu.Unlock()
		if pc.alive() {
			return pc
		}
		p.drop(pc)
		p.mu.Lock()
	}
	if p.gone || p.open >= peerMaxConns || time.Now().Before(p.badUntil) {
		p.mu.Unlock()
		return nil
	}
	p.open++
	p.mu.Unlock()
	pc, err := p.dial()
	now := time.Now()
	if err != nil {
		p.mu.Lock()
		p.open--
		p.badUntil = now.Add(peerRetry)
		log := p.failing.IsZero() || now.Sub(p.loggedAt) >= peerLogEvery
		if p.failing.IsZero() {
			p.failing = now
		}
		if log {
			p.loggedAt = now
		}
		p.mu.Unlock()
		if log { // when it turns unreachable, then every peerLogEvery (a dial every peerRetry)
			p.l.c.r.cfg.Logger.Warn("pairing: peer link: cannot reach a node directly; its requests go by NATS", "node", p.node, "addr", p.addr, "err", err)
		}
		return nil
	}
	p.mu.Lock()
	since := p.failing
	p.failing = time.Time{}
	p.mu.Unlock()
	if !since.IsZero() {
		p.l.c.r.cfg.Logger.Info("pairing: peer link: a node is reachable directly again", "node", p.node, "addr", p.addr, "after", now.Sub(since).Round(time.Second))
	}
	return pc
}

// alive reports whether an idle connection is still open: the peer has not
// closed it (a node that stopped or was killed). Checked before a request
// is written on it, so that such a connection does not turn a call into
// one in doubt. Costs one non-blocking peek.
func (pc *peerConn) alive() bool {
	return pc.br.Buffered() == 0 && peerOpen(pc.raw) // nothing is due on an idle connection
}

// put returns a connection whose answer was read whole. Idle connections
// past peerIdle that have not been used for peerIdleTTL are closed.
func (p *peer) put(pc *peerConn) {
	now := time.Now()
	pc.used = now
	var stale []*peerConn
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		p.drop(pc)
		return
	}
	p.idle = append(p.idle, pc)
	n := 0 // least recently used first
	for n < len(p.idle)-peerIdle && now.Sub(p.idle[n].used) > peerIdleTTL {
		n++
	}
	if n > 0 {
		stale = append(stale, p.idle[:n]...)
		p.idle = append(p.idle[:0], p.idle[n:]...)
	}
	p.mu.Unlock()
	for _, pc := range stale {
		p.drop(pc)
	}
}

// drop closes a connection that will not be used again.
func (p *peer) drop(pc *peerConn) {
	_ = pc.raw.Close() // (a TLS close would first try to write its alert)
	p.mu.Lock()
	p.open--
	p.mu.Unlock()
}

// suspect stops using p for peerRetry and closes its idle connections.
func (p *peer) suspect() {
	p.mu.Lock()
	p.badUntil = time.Now().Add(peerRetry)
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, pc := range idle {
		p.drop(pc)
	}
}

// close ends the peer: idle connections closed, busy ones when their
// request ends.
func (p *peer) close() {
	p.mu.Lock()
	p.gone = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, pc := range idle {
		p.drop(pc)
	}
}

func (p *peer) dial() (*peerConn, error) {
	r := p.l.c.r
	r.mu.Lock()
	shutting := r.shutting
	r.mu.Unlock()
	if shutting {
		return nil, ErrClosed
	}
	d := net.Dialer{Timeout: peerHandshake, KeepAliveConfig: peerKeepAlive, Control: func(_, _ string, rc syscall.RawConn) error {
		_ = peerSockopt(rc) // without it, the keep-alive alone finds a gone peer
		return nil
	}}
	raw, err := d.Dial("tcp", p.addr)
	if err != nil {
		return nil, err
	}
	_ = raw.SetDeadline(time.Now().Add(peerHandshake))
	nc := raw
	if p.cert != nil {
		tc := tls.Client(raw, &tls.Config{
			MinVersion: tls.VersionTLS13,
			// The certificate is self-made: pinned by the fingerprint the
			// owner published on NATS, not checked against a chain.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					return errors.New("no certificate")
				}
				if sum := sha256.Sum256(cs.PeerCertificates[0].Raw); !hmac.Equal(sum[:], p.cert) {
					return errors.New("the node at that address does not hold the certificate its admit published")
				}
				return nil
			},
		})
		if err := tc.Handshake(); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		nc = tc
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	if err := clientHandshake(nc, br, p.node, p.key); err != nil {
		_ = raw.Close()
		return nil, err
	}
	return &peerConn{nc: nc, raw: raw, br: br}, nil
}

// clientHandshake: → "LAPDPEER2 <node> <cnonce>\n"; ← "<snonce> <proof>\n",
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

// readFrame reads one frame's bytes after its length into a pooled buffer:
// b aliases buf, which the caller releases (putReadBuf).
func readFrame(br *bufio.Reader, max uint32, min uint32) (buf *bytes.Buffer, b []byte, err error) {
	var hdr [4]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < min || n > max {
		return nil, nil, fmt.Errorf("pairing: peer: a frame of %d bytes", n)
	}
	buf = bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	buf.Grow(int(n))
	b = buf.Bytes()[:n] // within the capacity Grow made; buf's length stays 0
	if _, err := io.ReadFull(br, b); err != nil {
		putReadBuf(buf)
		return nil, nil, err
	}
	return buf, b, nil
}

func parseAnswer(b []byte) (a peerAnswer, ok bool) {
	kind, meta := b[0], b[1]
	b = b[2:]
	if meta == 1 {
		if len(b) < 10 {
			return a, false
		}
		a.meta, a.gen = true, binary.BigEndian.Uint64(b)
		hl := int(binary.BigEndian.Uint16(b[8:]))
		b = b[10:]
		if len(b) < hl {
			return a, false
		}
		a.health, b = b[:hl], b[hl:]
	}
	switch kind {
	case 0:
		if len(b) == 0 {
			return a, false
		}
		a.body = b
	case 1:
		a.moved = true
	default:
		return a, false
	}
	return a, true
}

// request sends one request and reads its answer. errNoLink and errMoved
// mean nothing was done (send it by NATS); ErrLinkLost means it was sent
// and not answered; ctx.Err() that ctx ended first, and
// context.DeadlineExceeded that deadline (when not zero and before ctx's)
// passed first. The caller releases the answer's buf.
func (p *peer) request(ctx context.Context, deadline time.Time, op, tid string, admit bool, body []byte) (peerAnswer, error) {
	pc := p.take()
	if pc == nil {
		return peerAnswer{}, errNoLink
	}
	n := 1 + 1 + len(op) + 2 + len(tid) + len(body)
	fb := getFrameBuf(4 + n)
	f := binary.BigEndian.AppendUint32((*fb)[:0], uint32(n))
	flags := byte(0)
	if admit {
		flags = 1
	}
	f = append(f, flags, byte(len(op)))
	f = append(f, op...)
	f = binary.BigEndian.AppendUint16(f, uint16(len(tid)))
	f = append(f, tid...)
	f = append(f, body...)
	// The owner answers by the caller's deadline itself (the request
	// carries it), so the read waits peerLate beyond it: an answer that
	// does not come by then means the node, or the way to it, is gone.
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	var readBy time.Time
	if !deadline.IsZero() {
		readBy = deadline.Add(peerLate)
	}
	_ = pc.nc.SetReadDeadline(readBy)
	_ = pc.nc.SetWriteDeadline(time.Now().Add(peerWrite))
	stop := func() bool { return true }
	if ctx.Done() != nil {
		// A caller that goes away ends the read (no goroutine waits for it).
		stop = context.AfterFunc(ctx, func() {
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				_ = pc.nc.SetReadDeadline(time.Unix(1, 0))
			}
		})
	}
	wrote, err := pc.nc.Write(f)
	*fb = f
	putFrameBuf(fb)
	if err != nil {
		stop()
		p.drop(pc)
		if wrote == 0 && ctx.Err() == nil {
			return peerAnswer{}, errNoLink
		}
		return peerAnswer{}, ErrLinkLost
	}
	p.l.sent.Add(1)
	buf, b, err := readFrame(pc.br, uint32(p.l.c.r.cfg.MaxFrame)+1<<20, 2)
	stopped := stop()
	if err != nil {
		p.drop(pc) // what comes next on it, if anything, is this answer
		expired := !deadline.IsZero() && !time.Now().Before(deadline)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && expired && !errors.Is(ctx.Err(), context.Canceled) {
			// No answer peerLate after the deadline the owner keeps: the
			// node is gone without a reset (a machine that lost power).
			// Its other connections would wait as this one did: NATS
			// carries its requests for a while.
			p.suspect()
		}
		if ctx.Err() != nil {
			return peerAnswer{}, ctx.Err()
		}
		if expired {
			return peerAnswer{}, context.DeadlineExceeded
		}
		return peerAnswer{}, ErrLinkLost
	}
	a, ok := parseAnswer(b)
	if !ok {
		putReadBuf(buf)
		p.drop(pc)
		return peerAnswer{}, ErrLinkLost
	}
	if stopped || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		p.put(pc) // (the AfterFunc leaves the deadline alone for an expired ctx)
	} else {
		p.drop(pc) // the AfterFunc ran or runs: its deadline may land on the next request
	}
	if a.moved {
		putReadBuf(buf)
		return peerAnswer{}, errMoved
	}
	a.buf = buf
	return a, nil
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
		if l.closed || len(l.inbound) >= peerInbound {
			l.mu.Unlock()
			_ = nc.Close()
			continue
		}
		ip, _, _ := net.SplitHostPort(nc.RemoteAddr().String())
		if !l.allowLocked(clientip.Key(ip), time.Now()) { // (loopback: one key for 127.0.0.0/8)
			l.mu.Unlock()
			_ = nc.Close()
			l.refuse(nc.RemoteAddr().String(), ip, errors.New("too many new connections from this address"))
			continue
		}
		l.inbound[nc] = struct{}{}
		l.c.r.wg.Add(1)
		l.mu.Unlock()
		if sc, ok := nc.(syscall.Conn); ok {
			if rc, err := sc.SyscallConn(); err == nil {
				_ = peerSockopt(rc) // without it, the keep-alive alone finds a gone requester
			}
		}
		go l.serveConn(nc)
	}
}

// refuse counts, logs (at most once a second) and audits a refused
// connection.
func (l *peerLink) refuse(remote, ip string, err error) {
	l.refusals.Add(1)
	if now, last := time.Now().UnixNano(), l.loggedRefusal.Load(); now-last > int64(time.Second) && l.loggedRefusal.CompareAndSwap(last, now) {
		l.c.r.cfg.Logger.Warn("pairing: peer link: refused a connection (at most one such line a second; audited within the address's budget)", "remote", remote, "err", err)
	}
	// Within the address's audit budget, as the LAP gate's refusals: a
	// flood of connections becomes counted summary entries.
	l.c.r.cfg.Audit.RecordLimited(context.Background(), "ip:"+clientip.Key(ip), audit.Entry{Event: audit.EventAuthFailed,
		Detail: map[string]any{"endpoint": "peer-link", "ip": ip, "reason": err.Error()}})
}

// allowLocked spends one of ip's new-connection tokens: peerConnBurst, then
// peerConnRate a second. A node opens connections only as its requests
// need them (at most peerMaxConns), so this bounds what a stranger at
// another address makes the node do (a handshake, a TLS one's signature)
// without slowing a peer; a peer refused meanwhile sends by NATS.
func (l *peerLink) allowLocked(ip string, now time.Time) bool {
	b := l.perIP[ip]
	if b == nil {
		if len(l.perIP) >= maxRemote {
			clear(l.perIP) // many addresses: start over rather than grow
		}
		b = &connBucket{tokens: peerConnBurst, at: now}
		l.perIP[ip] = b
	}
	b.tokens = min(peerConnBurst, b.tokens+now.Sub(b.at).Seconds()*peerConnRate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

type connBucket struct {
	tokens float64
	at     time.Time
}

// serverHandshake is clientHandshake's other side.
func (l *peerLink) serverHandshake(nc net.Conn, br *bufio.Reader) error {
	line, err := readLine(br)
	if err != nil {
		return err
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != peerProto {
		return errors.New("not a lapd peer (or another version of the link)")
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

// serveConn serves one inbound connection: each request is read, served
// and answered on this goroutine, which outlives the request (its stack
// stays grown for the next).
func (l *peerLink) serveConn(raw net.Conn) {
	defer l.c.r.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.inbound, raw)
		l.mu.Unlock()
		_ = raw.Close()
	}()
	_ = raw.SetDeadline(time.Now().Add(peerHandshake))
	nc := raw
	if l.tls != nil {
		nc = tls.Server(raw, l.tls) // its handshake runs on the first read, within the deadline
	}
	br := bufio.NewReaderSize(nc, 16<<10)
	if err := l.serverHandshake(nc, br); err != nil {
		ip, _, _ := net.SplitHostPort(nc.RemoteAddr().String())
		l.refuse(nc.RemoteAddr().String(), ip, err)
		return
	}
	_ = nc.SetDeadline(time.Time{})
	max := uint32(l.c.r.cfg.MaxFrame) + 1<<20
	pr := &peerReq{nc: nc, tls: l.tls != nil}
	for {
		buf, b, err := readFrame(br, max, 4)
		if err != nil {
			return
		}
		ok := parseRequest(b, pr)
		if !ok {
			putReadBuf(buf)
			return
		}
		l.mu.Lock()
		draining := l.draining
		if !draining {
			l.inflight.Add(1)
		}
		l.mu.Unlock()
		if draining { // nothing done: the requester goes by NATS
			pr.write(0, nil, true, nil)
		} else {
			l.c.handlePeer(pr)
			l.inflight.Done()
		}
		putReadBuf(buf)
		if pr.failed {
			return
		}
	}
}

// peerReq is the request being served on a connection; its fields alias
// the frame's buffer until it is answered.
type peerReq struct {
	nc     net.Conn
	tls    bool // nc is TLS: one Write (a writev would be one record per buffer)
	hdr    [4 + 2 + 8 + 2]byte
	iov    [4][]byte   // the writev's buffers (kept here: a local array escaped, per answer)
	bufs   net.Buffers // over iov
	admit  bool
	op     string
	tid    string
	body   []byte
	failed bool // the answer could not be written: the connection ends
}

func parseRequest(b []byte, pr *peerReq) bool {
	pr.admit = b[0]&1 != 0
	ol := int(b[1])
	b = b[2:]
	if len(b) < ol+2 {
		return false
	}
	pr.op, b = peerOp(b[:ol]), b[ol:]
	tl := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	if len(b) < tl {
		return false
	}
	if string(b[:tl]) != pr.tid { // a connection mostly serves one tab's calls: keep its tid
		pr.tid = string(b[:tl])
	}
	pr.body = b[tl:]
	return true
}

// peerOp returns op as a string without allocating for the ops a node
// sends.
func peerOp(op []byte) string {
	switch string(op) {
	case "call":
		return "call"
	case "admit":
		return "admit"
	case "watch":
		return "watch"
	case "push":
		return "push"
	case "logpush":
		return "logpush"
	case "append":
		return "append"
	case "expect":
		return "expect"
	case "hello":
		return "hello"
	case "health":
		return "health"
	case "log":
		return "log"
	case "unregister":
		return "unregister"
	}
	return string(op)
}

// leads holds the first byte of a reply body ('0' ok, '1' error), written
// from here so that a payload goes out from where it lies.
var leads = [2]byte{'0', '1'}

// answer writes pr's reply: lead + body, or, when moved, no body.
func (pr *peerReq) answer(lead byte, body []byte, moved bool, meta *replyMeta) {
	pr.write(lead, body, moved, meta)
}

// write writes a reply (one writev).
func (pr *peerReq) write(lead byte, body []byte, moved bool, meta *replyMeta) {
	h := pr.hdr[:4]
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
	_ = pr.nc.SetWriteDeadline(time.Now().Add(peerWrite))
	if pr.tls {
		fb := getFrameBuf(len(h) + len(health) + len(l) + len(body))
		f := append(append(append(append((*fb)[:0], h...), health...), l...), body...)
		if _, err := pr.nc.Write(f); err != nil {
			pr.failed = true
		}
		*fb = f
		putFrameBuf(fb)
		return
	}
	pr.iov = [4][]byte{h, health, l, body}
	pr.bufs = pr.iov[:]
	if _, err := pr.bufs.WriteTo(pr.nc); err != nil {
		pr.failed = true
	}
	pr.iov, pr.bufs = [4][]byte{}, nil // (body aliases a buffer reused after)
}

// peerTLSOn decides whether the listener speaks TLS: mode "on", "off", or
// "" / "auto" = on unless addr (the address other nodes dial) is a
// loopback one.
func peerTLSOn(mode, addr string) (bool, error) {
	switch mode {
	case "on":
		return true, nil
	case "off":
		return false, nil
	case "", "auto":
		return !hostguard.IsLoopbackName(hostguard.Name(addr)), nil
	}
	return false, fmt.Errorf("pairing: peer link: TLS %q: want auto, on or off", mode)
}

// selfSigned makes the listener's certificate and its SHA-256 (what the
// admit replies publish). Ephemeral: a new one at every start.
func selfSigned(node string) (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "lapd peer " + node},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0), // pinned, not checked: as long as the process lives
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	sum := sha256.Sum256(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, sum[:], nil
}
