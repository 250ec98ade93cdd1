package pairing

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/clientip"
	"github.com/lapd-dev/lapd/tokens"
)

// Sub-protocol names (docs/PROTOCOL.md): a client may carry its token as a
// Sec-WebSocket-Protocol entry "lapd.token.<token>" and offer "lapd.v2"
// alongside, which the server then selects.
const (
	Subprotocol         = "lapd.v2"
	TokenProtocolPrefix = "lapd.token."
	// TabProtocolPrefix carries the tab secret: "lapd.tab.<secret>".
	TabProtocolPrefix = "lapd.tab."
)

const wsEndpoint = "/agent/ws"

// conn is one accepted socket. Its reader is the ServeHTTP goroutine; its
// writer runs only while frames are queued.
type conn struct {
	r      *Registry
	s      *session
	ws     *websocket.Conn
	nc     net.Conn // the hijacked connection, to bound a close handshake
	repair bool
	// tab: the socket proved the session's tab secret. noApprove: it did
	// not, and it superseded a live socket; its confirm-resolved frames are
	// refused.
	tab, noApprove bool
	// rev orders this socket against another node's socket for the same
	// tid (cluster.go, "Who owns a tid"): the token store's revision of
	// the write that connected it (0: the store keeps none).
	rev uint64

	mu       sync.Mutex
	q        [][]byte
	inFlight int           // frames taken by the writer, not yet written
	writing  bool          // a writer goroutine is running
	wdone    chan struct{} // closed when that writer exits
	closing  bool          // close(code) was called
	code     int           // the code we closed with, 0 = the peer or the network did
	gone     bool          // the reader has exited; nothing may start goroutines for this conn
	acked    bool          // hello-ack sent at least once
	pinged   bool          // a ping is outstanding
	ponged   bool          // it was answered
	missed   int           // consecutive unanswered pings
	since    int64         // ms when the socket was accepted
	appBeats bool          // the tab sends {t:'ping'} heartbeats: no WebSocket pings needed
	lastBeat atomic.Int64  // ms of its last sign of life (any frame, or a pong)
	inWait   bool          // the reader is in waitIdle (guarded by mu)
	kicked   bool          // the registry loop ended that wait: the tab is idle (guarded by mu)

	in      inbound       // the socket's inbound frame and byte rates (kept across parks)
	sock    sock          // what the library reads and closes (see sock)
	br      *bufio.Reader // the library's read buffer over sock (from Hijack), for parking
	closeMu sync.Mutex    // held around ws.Close, whose handshake reads br too
	fd      int           // the socket's file descriptor (-1 = unknown: never parked)
	parkID  int32         // non-zero while parked (guarded by Registry.park.mu)
	reads   atomic.Uint64 // frames read; the loop compares it between ticks
	// writeSince is when the writer's frame in progress began (ms; 0 =
	// none): the registry loop closes a socket whose write has taken
	// longer than WriteTimeout (checkWrite).
	writeSince atomic.Int64
	seen       uint64 // reads at the loop's last tick (loop goroutine only)
}

// closeGrace bounds a server-initiated close handshake.
const closeGrace = time.Second

// hijackRecorder hands the WebSocket library the accepted socket as c.sock
// (reads through a pooled buffer held only while bytes wait, see sock), a
// bufio.Reader of sockPeekSize over it and a small write buffer: net/http
// gives the hijacker its 4 KiB read buffer and a fresh 4 KiB write buffer,
// which an idle tab would keep for its whole life. Frames larger than the
// write buffer are written past it.
type hijackRecorder struct {
	http.ResponseWriter
	c  *conn
	nc net.Conn
	br *bufio.Reader
}

// writeBufSize is an accepted socket's write buffer: an rpc frame or a pong
// fits in one write.
const writeBufSize = 256

func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return nc, brw, err
	}
	h.nc = nc
	// Bytes the client sent right after its request (its first frames)
	// were read by net/http: they are read first.
	var early []byte
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ = brw.Reader.Peek(n)
	}
	h.c.sock.init(nc, early)
	if err := brw.Writer.Flush(); err != nil {
		return nc, brw, err
	}
	h.br = bufio.NewReaderSize(&h.c.sock, sockPeekSize)
	return &h.c.sock, bufio.NewReadWriter(h.br, bufio.NewWriterSize(nc, writeBufSize)), nil
}

// refuse writes the JSON error envelope and audits the refusal.
func (r *Registry) refuse(w http.ResponseWriter, req *http.Request, status int, code, detail, tid string) {
	r.refused.Add(1)
	body := map[string]any{"code": code}
	if detail != "" {
		body["detail"] = detail
	}
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	if status == http.StatusUnauthorized { // RFC 7235 §3.1, RFC 6750 §3
		w.Header().Set("WWW-Authenticate", `Bearer realm="lapd"`)
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": body})
	// Within the client's audit budget: a flood of refused upgrades becomes
	// one counted entry per interval.
	ip := remoteHost(req)
	r.cfg.Audit.RecordLimited(context.Background(), "ip:"+clientip.Key(ip), audit.Entry{TID: tid, Event: audit.EventRefused, // (all of 127/8 one budget, IPv6 per /64)
		Detail: map[string]any{"endpoint": wsEndpoint, "status": status, "code": code, "client": ip}})
}

// detailWSShutting is the refusal's detail while lapd stops: the client
// retries (Retry-After), and reaches lapd again or another node.
const detailWSShutting = "lapd is shutting down; reconnect in a few seconds (to this lapd once it is back, or to another node)"

// remoteHost is the peer's address without the port.
func remoteHost(req *http.Request) string {
	if h, _, err := net.SplitHostPort(req.RemoteAddr); err == nil {
		return h
	}
	return req.RemoteAddr
}

// originAllowed is the CSWSH defence: no Origin (not a browser), an
// allowlisted Origin, the PublicURL, or the request's own origin. The own
// origin is built from X-Forwarded-Proto/-Host only behind a trusted proxy
// (TrustProxy > 0): a direct client could write anything there.
func (r *Registry) originAllowed(req *http.Request) bool {
	origin := req.Header.Get("Origin")
	if origin == "" {
		return true
	}
	for _, o := range r.cfg.AllowedOrigins {
		if origin == o {
			return true
		}
	}
	if r.cfg.PublicURL != "" && strings.EqualFold(origin, strings.TrimRight(r.cfg.PublicURL, "/")) {
		return true
	}
	scheme := "http"
	if req.TLS != nil {
		scheme = "https"
	}
	host := req.Host
	if r.cfg.TrustProxy > 0 {
		if p := firstValue(req.Header.Get("X-Forwarded-Proto")); p == "http" || p == "https" {
			scheme = p
		}
		if h := firstValue(req.Header.Get("X-Forwarded-Host")); h != "" {
			host = h
		}
	}
	return strings.EqualFold(origin, scheme+"://"+host)
}

func firstValue(v string) string {
	v, _, _ = strings.Cut(v, ",")
	return strings.TrimSpace(v)
}

// bearer finds the token: ?token= wins, then Authorization: Bearer, then a
// lapd.token.<token> sub-protocol entry.
func bearer(req *http.Request) string {
	if t := req.URL.Query().Get("token"); t != "" {
		return t
	}
	if a := req.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
		return strings.TrimSpace(a[7:])
	}
	return protocolValue(req, TokenProtocolPrefix)
}

// protocolValue is the value of the first Sec-WebSocket-Protocol entry
// "<prefix><value>", or "".
func protocolValue(req *http.Request, prefix string) string {
	for _, h := range req.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if t, ok := strings.CutPrefix(strings.TrimSpace(p), prefix); ok && t != "" {
				return t
			}
		}
	}
	return ""
}

// isUpgrade reports whether req asks for a WebSocket upgrade at all, so that a
// plain GET does not move the token's state.
func isUpgrade(req *http.Request) bool {
	hasToken := func(h, tok string) bool {
		for _, v := range req.Header.Values(h) {
			for _, p := range strings.Split(v, ",") {
				if strings.EqualFold(strings.TrimSpace(p), tok) {
					return true
				}
			}
		}
		return false
	}
	return hasToken("Connection", "upgrade") && hasToken("Upgrade", "websocket")
}

// ServeHTTP is the /agent/ws endpoint. It serves the socket until it closes.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	shutting := r.shutting
	if !shutting {
		r.wg.Add(1) // Shutdown waits for this handler
	}
	r.mu.Unlock()
	if shutting {
		r.refuse(w, req, http.StatusServiceUnavailable, "shutting-down", detailWSShutting, "")
		return
	}
	defer r.wg.Done()

	if req.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		r.refuse(w, req, http.StatusMethodNotAllowed, "method-not-allowed", "use GET with a WebSocket upgrade", "")
		return
	}
	if !r.originAllowed(req) {
		r.refuse(w, req, http.StatusForbidden, "forbidden-origin", "Origin "+strconv.Quote(req.Header.Get("Origin"))+" is not allowed: only lapd's own origin and the origins it is configured with may open the socket (lapd serve --origins, or Config.Origins for an embedded lapd); add the app's origin there", "")
		return
	}
	token := bearer(req)
	if token == "" {
		r.refuse(w, req, http.StatusUnauthorized, "auth-failed", "no token: open the socket with the token /agent/mint gave (wsUrl?token=<token>, the Sec-WebSocket-Protocol entry "+TokenProtocolPrefix+"<token>, or Authorization: Bearer <token>)", "")
		return
	}
	if !isUpgrade(req) {
		r.refuse(w, req, http.StatusBadRequest, "invalid", "expected a WebSocket upgrade", "")
		return
	}
	// The token is checked, and nothing is changed, before the upgrade: an
	// upgrade that fails leaves the session as it was.
	tabSecret := protocolValue(req, TabProtocolPrefix)
	rec, err := r.cfg.Tokens.CheckAcceptTab(req.Context(), token, tabSecret)
	switch {
	case errors.Is(err, tokens.ErrTabSecret):
		r.refuse(w, req, http.StatusUnauthorized, "auth-failed", "this session's socket opens with its tab secret (sub-protocol lapd.tab.<secret>), which only the tab that minted it holds", rec.TID)
		return
	case errors.Is(err, tokens.ErrRevoked):
		r.refuse(w, req, http.StatusForbidden, "revoked", "this session was revoked (the user disconnected it, or it was replaced); mint a new session (/agent/mint) to connect again", rec.TID)
		return
	case errors.Is(err, tokens.ErrMalformed), errors.Is(err, tokens.ErrUnknown), errors.Is(err, tokens.ErrExpired):
		r.refuse(w, req, http.StatusUnauthorized, "auth-failed", "the token is unknown or expired (past its lifetime, or past the grace window after its socket closed); mint a new session (/agent/mint), or claim this one with /agent/resume/claim while it is within its grace window", rec.TID)
		return
	case err != nil:
		r.cfg.Logger.Error("pairing: accepting a token failed", "err", err)
		r.refuse(w, req, http.StatusInternalServerError, "internal", "lapd could not read its token store (its log says why); retry in a few seconds", rec.TID)
		return
	}
	if r.cl != nil {
		// A tab whose node died: its record is still active and no node
		// holds it; make this accept a re-pair (cluster.go).
		r.cl.orphaned(req.Context(), token)
	}
	s := r.reserve(rec.TID)
	if s == nil {
		r.refuse(w, req, http.StatusServiceUnavailable, "shutting-down", detailWSShutting, rec.TID)
		return
	}

	c := &conn{r: r, s: s, tab: rec.TabHash != ""}
	hr := &hijackRecorder{ResponseWriter: w, c: c}
	ws, err := websocket.Accept(hr, req, &websocket.AcceptOptions{
		Subprotocols: []string{Subprotocol},
		// The Origin check was done above (allowlist or same-origin, with
		// X-Forwarded-* support), so the library's own check is skipped.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
		OnPongReceived:     func(context.Context, []byte) { c.heartbeat(false) },
	})
	if err != nil {
		r.refused.Add(1)
		r.cfg.Logger.Info("pairing: WebSocket upgrade failed", "tid", rec.TID, "err", err)
		r.unreserve(s)
		return
	}
	ws.SetReadLimit(r.cfg.MaxFrame)
	c.ws, c.nc, c.br = ws, hr.nc, hr.br
	c.fd = connFD(hr.nc)
	c.in = r.newInbound()
	c.since = time.Now().UnixMilli()
	c.lastBeat.Store(c.since)
	if r.cl != nil && !c.tab && !r.holds(rec.TID) {
		// Superseding a live socket on another node without the tab
		// secret: as for a local one, this socket may not approve.
		c.noApprove = r.cl.liveElsewhere(rec.TID)
	}
	repair, old, code, err := r.connect(s, c, rec.TokenHash, tabSecret)
	if err != nil {
		switch code {
		case CloseRestart:
			r.refused.Add(1)
		case CloseRevoked:
			r.cfg.Logger.Info("pairing: the token changed during the upgrade", "tid", rec.TID, "err", err)
		default: // the store did not take the connect: the tab retries
			r.cfg.Logger.Warn("pairing: the token store did not record the tab's connect; closed it with 1011 (it reconnects)", "tid", rec.TID, "err", err)
		}
		if c.nc != nil {
			_ = c.nc.SetDeadline(time.Now().Add(closeGrace))
		}
		ws.Close(websocket.StatusCode(code), closeText(code))
		return
	}
	c.repair = repair
	if old != nil {
		r.cfg.Audit.Record(context.Background(), audit.Entry{TID: rec.TID, UID: rec.UID, Event: audit.EventSupersede,
			Detail: map[string]any{"tabSecret": c.tab, "approvals": !c.noApprove}})
	}
	r.cfg.Audit.Record(context.Background(), audit.Entry{TID: rec.TID, UID: rec.UID, Event: audit.EventClaim,
		Detail: map[string]any{"transport": "ws", "repair": repair}})
	// The socket is served by a goroutine of its own, and this handler
	// returns: the HTTP server's goroutine (its stack grown by serving the
	// request) and the request's memory do not stay with an idle tab. The
	// count taken here is the socket's until connGone, parked or not.
	r.wg.Add(1) // legal: this handler holds a count
	go c.serve()
}

// errParked: the reader parked the socket (see parker) and exits.
var errParked = errors.New("pairing: parked")

// serve reads the socket until it ends, or parks it.
func (c *conn) serve() {
	err := c.readLoop()
	if err == errParked {
		return // the parker runs serve again when the tab sends something
	}
	c.r.connGone(c, err)
	c.r.wg.Done()
}

// reserve notes that a socket for tid is being upgraded (nil while
// shutting down). Until the socket is registered (connect) or its upgrade
// fails (unreserve), a socket of tid that closes does not move the token
// record to pending-resume: that would mark the new, live socket's session
// disconnected (see afterClose).
func (r *Registry) reserve(tid string) *session {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shutting {
		return nil
	}
	s := r.sessions[tid]
	if s == nil {
		s = &session{tid: tid}
		r.sessions[tid] = s
	}
	if s.closedElem != nil { // kept while the upgrade runs
		r.closed.Remove(s.closedElem)
		s.closedElem = nil
	}
	s.stateMu.Lock()
	s.pending++
	s.stateMu.Unlock()
	return s
}

// unreserve ends a reservation whose upgrade failed: nothing changes,
// except that a disconnect deferred for this upgrade is applied now.
func (r *Registry) unreserve(s *session) {
	s.stateMu.Lock()
	s.pending--
	applyDue := s.pending == 0 && s.disconnectDue && s.socket() == nil
	if s.pending == 0 {
		s.disconnectDue = false
	}
	if applyDue {
		r.markDisconnected(s.tid)
	}
	s.stateMu.Unlock()
	r.mu.Lock()
	if s.socket() == nil && !s.dropped && r.sessions[s.tid] == s && s.closedElem == nil {
		s.closedAt = time.Now()
		s.closedElem = r.closed.PushBack(s)
		r.trimClosedLocked()
	}
	r.mu.Unlock()
}

// connect moves the token record for c's now open socket (Connected) and
// registers c as s's socket, superseding an older one, as one step with
// respect to the session's other state changes. On error c must be closed
// with code.
func (r *Registry) connect(s *session, c *conn, tokenHash, tabSecret string) (repair bool, old *conn, code int, err error) {
	if r.testHookConnect != nil {
		r.testHookConnect(s.tid)
	}
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.pending--
	due := s.disconnectDue && s.pending == 0
	if s.pending == 0 {
		s.disconnectDue = false
	}
	rec, repair, err := r.cfg.Tokens.Connected(context.Background(), s.tid, tokenHash, tabSecret)
	if err != nil {
		if due && s.socket() == nil {
			r.markDisconnected(s.tid)
		}
		code := int(websocket.StatusInternalError) // the store failed: the tab may retry
		if errors.Is(err, tokens.ErrRevoked) || errors.Is(err, tokens.ErrExpired) || errors.Is(err, tokens.ErrUnknown) || errors.Is(err, tokens.ErrTabSecret) {
			code = CloseRevoked
		}
		return false, nil, code, err
	}
	c.rev = rec.Rev
	old, ok := r.register(s, c)
	if !ok { // Shutdown began meanwhile
		r.markDisconnected(s.tid)
		return false, nil, CloseRestart, ErrClosed
	}
	return repair, old, 0, nil
}

// closeText is the close reason sent with a code from connect.
func closeText(code int) string {
	switch code {
	case CloseRestart:
		return "server restarting"
	case CloseRevoked:
		return "token no longer valid"
	}
	return "token store unavailable"
}

// register makes c s's socket; an older live one is superseded (and
// returned). A socket without the tab secret that supersedes a live one may
// not approve. false when Shutdown began or s was dropped meanwhile.
func (r *Registry) register(s *session, c *conn) (*conn, bool) {
	now := time.Now().UnixMilli()
	r.mu.Lock()
	if r.shutting {
		r.mu.Unlock()
		return nil, false
	}
	if r.sessions[s.tid] != s { // dropped (revoked) during the upgrade
		r.mu.Unlock()
		return nil, false
	}
	if s.closedElem != nil {
		r.closed.Remove(s.closedElem)
		s.closedElem = nil
	}
	c.s = s
	s.mu.Lock()
	old := s.cur
	s.cur = c
	s.accepts++
	s.connectedAt, s.lastHB = now, now
	s.mu.Unlock()
	r.rel.accepted.Add(1)
	if !r.loopOn {
		r.loopOn = true
		r.wg.Add(1)
		go r.loop()
	}
	r.mu.Unlock()
	if r.cl != nil {
		r.cl.own(s.tid, c)
	}
	if old != nil {
		old.mu.Lock()
		live := !old.closing && !old.gone
		old.mu.Unlock()
		// Set before c's reader starts, which is the only one to read it.
		c.noApprove = c.noApprove || (live && !c.tab)
		r.superseded.Add(1)
		old.close(CloseSuperseded, "superseded")
	}
	return old, true
}

// connGone runs on the reader goroutine when c's socket has ended.
func (r *Registry) connGone(c *conn, readErr error) {
	c.mu.Lock()
	c.gone = true
	c.q = nil
	code := c.code
	c.mu.Unlock()
	c.ws.CloseNow()
	c.sock.release()

	r.mu.Lock()
	s := c.s
	s.mu.Lock()
	mine := s.cur == c
	var orphans pending
	if mine {
		s.cur = nil
		orphans = s.takeAllLocked()
	}
	s.mu.Unlock()
	if mine && !s.dropped && r.sessions[s.tid] == s {
		s.closedAt = time.Now()
		s.closedElem = r.closed.PushBack(s)
		r.trimClosedLocked()
	}
	r.mu.Unlock()
	if mine && r.cl != nil {
		r.cl.disown(s.tid, s)
	}
	if mine {
		// Record the close (token → pending-resume with its grace) before
		// the calls that were in flight on this socket fail, so that their
		// 503 paused carries the grace left, as a call made after the drop
		// would, not the 5 s of a tab that never connected.
		r.afterClose(s, closeReason(code, readErr))
		orphans.fail(ErrPaused)
	}
}

// closeReason names why a socket ended, for the disconnect audit entry.
func closeReason(code int, err error) string {
	switch code {
	case CloseSuperseded:
		return "superseded"
	case CloseQueueOverflow:
		return "send-queue-overflow"
	case CloseHeartbeat:
		return "heartbeat-missed"
	case CloseRestart:
		return "shutdown"
	case CloseVersionSkew:
		return "version-skew"
	case CloseRevoked:
		return "revoked"
	case CloseOverloaded:
		return "overloaded"
	case int(websocket.StatusMessageTooBig):
		return "frame-too-big"
	}
	if errors.Is(err, errFrameTooBig) {
		return "frame-too-big"
	}
	if s := websocket.CloseStatus(err); s == websocket.StatusMessageTooBig {
		return "frame-too-big"
	} else if s != -1 {
		return "client-closed " + strconv.Itoa(int(s))
	}
	return "connection-lost"
}

// trimClosedLocked drops the closed tids past MaxClosed or Retention. Caller
// holds r.mu.
func (r *Registry) trimClosedLocked() {
	cutoff := time.Now().Add(-r.cfg.Retention)
	for e := r.closed.Front(); e != nil; e = r.closed.Front() {
		s := e.Value.(*session)
		if r.closed.Len() <= r.cfg.MaxClosed && s.closedAt.After(cutoff) {
			return
		}
		r.closed.Remove(e)
		s.closedElem = nil
		if r.sessions[s.tid] == s {
			delete(r.sessions, s.tid)
		}
		s.mu.Lock()
		r.bufBytes.Add(-int64(s.releaseBuffersLocked()))
		s.dropped = true
		s.mu.Unlock()
	}
}

// How send hands a frame to the writer.
type sendMode int

const (
	sendAsync  sendMode = iota // start a writer goroutine if none runs
	sendInline                 // write on the caller's goroutine if no writer runs
	sendHold                   // only queue: a later send or flush writes it
)

// enqueue queues b for the writer; a full queue closes the socket with 4008.
func (c *conn) enqueue(b []byte) error { return c.send(b, sendAsync) }

// send queues b for the writer, or, inline with no writer running, writes
// it on the caller's goroutine and then drains what others queued
// meanwhile: a call's rpc frame goes out without a goroutine hand-off (the
// caller waits for the reply anyway). Either way one writer at a time
// writes, each write bounded by WriteTimeout (checkWrite); a full queue
// closes the socket with 4008. The reader never writes inline: it must keep
// reading.
func (c *conn) send(b []byte, mode sendMode) error {
	c.mu.Lock()
	if c.closing || c.gone {
		c.mu.Unlock()
		return ErrPaused
	}
	if len(c.q)+c.inFlight >= c.r.cfg.SendQueue {
		c.mu.Unlock()
		c.r.overflowCloses.Add(1)
		c.close(CloseQueueOverflow, "send queue overflow")
		return ErrPaused
	}
	c.q = append(c.q, b)
	if c.writing || mode == sendHold {
		c.mu.Unlock()
		return nil
	}
	c.startWriterLocked(mode == sendInline)
	return nil
}

// flush starts a writer for frames queued with sendHold, if none runs.
func (c *conn) flush() {
	c.mu.Lock()
	if c.writing || len(c.q) == 0 || c.closing || c.gone {
		c.mu.Unlock()
		return
	}
	c.startWriterLocked(false)
}

// startWriterLocked starts the writer (inline: on this goroutine). Caller
// holds c.mu, which it releases.
func (c *conn) startWriterLocked(inline bool) {
	c.writing = true
	done := make(chan struct{})
	c.wdone = done
	c.r.wg.Add(1) // legal: the live reader holds a count (c.gone is false)
	c.mu.Unlock()
	if inline {
		c.writeLoop(done)
	} else {
		go c.writeLoop(done)
	}
}

// writeLoop drains the queue and returns when it is empty (or the socket is
// closing: close writes what is left after this writer's batch). It runs on
// its own goroutine or inline in send.
func (c *conn) writeLoop(done chan struct{}) {
	defer c.r.wg.Done()
	defer close(done)
	for {
		c.mu.Lock()
		c.inFlight = 0
		batch := c.q
		c.q = nil
		if len(batch) == 0 || c.closing || c.gone {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.inFlight = len(batch)
		c.mu.Unlock()
		for i, b := range batch {
			// Bounded by WriteTimeout through writeSince (see
			// checkWrite), not a context: a timer and a context per
			// frame were a kilobyte of garbage per call.
			c.writeSince.Store(time.Now().UnixMilli())
			err := c.ws.Write(context.Background(), websocket.MessageText, b)
			c.writeSince.Store(0)
			if err == nil {
				c.r.framesOut.Add(1)
				c.r.bytesOut.Add(int64(len(b)))
			}
			batch[i] = nil
			if err != nil {
				c.mu.Lock()
				c.writing, c.inFlight, c.q = false, 0, nil
				c.mu.Unlock()
				c.r.park.unpark(c) // a reader must see the close and clean up
				c.ws.CloseNow()
				return
			}
		}
	}
}

// close closes the socket with code, once, without blocking the caller.
func (c *conn) close(code int, reason string) {
	c.mu.Lock()
	if c.closing || c.gone {
		c.mu.Unlock()
		return
	}
	c.closing = true
	c.code = code
	pending := c.q
	c.q = nil
	writer := c.wdone
	if !c.writing {
		writer = nil
	}
	c.r.wg.Add(1)
	c.mu.Unlock()
	c.r.park.unpark(c) // before the socket closes: a reader must clean up
	go func() {
		defer c.r.wg.Done()
		// Frames queued before the close (e.g. {t:'revoked'}) go out first:
		// the writer's batch in flight, then what was still queued, unless
		// the writer is stuck.
		ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		if writer != nil {
			select {
			case <-writer:
			case <-ctx.Done():
			}
		}
		if code == CloseQueueOverflow {
			pending = nil
		}
		for _, b := range pending {
			if c.ws.Write(ctx, websocket.MessageText, b) != nil {
				break
			}
			c.r.framesOut.Add(1)
			c.r.bytesOut.Add(int64(len(b)))
		}
		cancel()
		// A tab that stopped reading never answers the close frame: bound
		// the handshake instead of the library's 5s+5s.
		if c.nc != nil {
			_ = c.nc.SetDeadline(time.Now().Add(closeGrace))
		}
		c.closeMu.Lock()
		c.ws.Close(websocket.StatusCode(code), reason)
		c.closeMu.Unlock()
	}()
}

// heartbeat records a sign of life (a pong, or a {t:'ping'} frame: app
// true).
func (c *conn) heartbeat(app bool) {
	c.mu.Lock()
	c.ponged, c.missed = true, 0
	c.lastBeat.Store(time.Now().UnixMilli())
	if app {
		c.appBeats = true
	}
	c.mu.Unlock()
	c.s.mu.Lock()
	c.s.lastHB = time.Now().UnixMilli()
	c.s.mu.Unlock()
}

// loop is the registry-wide heartbeat, park and sweep loop: every tick
// (a third of PingInterval, at most parkAfter) it trims closed sessions,
// kicks idle readers so they park and, after a burst of pairings, returns
// its garbage (releaser); every PingInterval it pings. It exits on
// Shutdown or when no tid is left.
func (r *Registry) loop() {
	defer r.wg.Done()
	tick := min(r.cfg.PingInterval/3, parkAfter)
	t := time.NewTicker(tick)
	defer t.Stop()
	lastPing := time.Now()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		r.trimClosedLocked()
		if len(r.sessions) == 0 {
			r.loopOn = false
			r.mu.Unlock()
			return
		}
		conns := make([]*conn, 0, len(r.sessions))
		for _, s := range r.sessions {
			s.mu.Lock()
			if s.cur != nil {
				conns = append(conns, s.cur)
			}
			s.mu.Unlock()
		}
		r.mu.Unlock()
		pingNow := time.Since(lastPing) >= r.cfg.PingInterval-tick/2
		if pingNow {
			lastPing = time.Now()
		}
		now := time.Now().UnixMilli()
		for _, c := range conns {
			c.checkWrite(now)
			c.kickIfIdle()
			if pingNow {
				c.ping()
			}
		}
		r.rel.tick(time.Now())
	}
}

// checkWrite closes c's socket when the frame its writer is writing has
// taken longer than WriteTimeout (the tab stopped reading): the write fails
// and the reader cleans up. Checked every registry tick, so a write may take
// up to a tick longer. Called by the registry loop only.
func (c *conn) checkWrite(now int64) {
	if since := c.writeSince.Load(); since != 0 && now-since > c.r.cfg.WriteTimeout.Milliseconds() {
		c.r.writeTimeouts.Add(1)
		c.ws.CloseNow()
	}
}

// parkAfter bounds how long a tab with nothing to read keeps its reader
// goroutine before it is parked (at the next tick of the loop after that).
const parkAfter = time.Second

// ping checks the last ping's answer and sends the next one. The goroutine
// that sends it lives until the pong (about a round trip) or PingInterval.
//
// A tab that sends its own {t:'ping'} heartbeats (lapd.js does, every
// hello-ack heartbeatMs) gets no WebSocket pings: it is closed (4408) when
// it has sent nothing for two intervals and a half — two and a half
// minutes, at least, while it says it is hidden (HiddenBeat). Besides
// saving a frame each way, that keeps an idle tab's reader parked outside
// the WebSocket library (a pong is read inside it).
func (c *conn) ping() {
	c.mu.Lock()
	if c.closing || c.gone {
		c.mu.Unlock()
		return
	}
	now := time.Now().UnixMilli()
	if c.appBeats {
		silent := now - c.lastBeat.Load()
		c.mu.Unlock()
		every := c.r.cfg.PingInterval
		if c.s.hidden() {
			every = max(every, HiddenBeat)
		}
		if silent > (every * 5 / 2).Milliseconds() {
			c.r.hbCloses.Add(1)
			c.close(CloseHeartbeat, "heartbeat missed")
		}
		return
	}
	if now-c.since < (c.r.cfg.PingInterval * 3 / 2).Milliseconds() {
		// A new socket gets an interval and a half to show that it sends
		// its own heartbeats (lapd.js's first comes one interval after
		// hello-ack) before WebSocket pings start.
		c.mu.Unlock()
		return
	}
	if c.pinged && !c.ponged {
		c.missed++
	}
	if c.missed >= 2 {
		c.mu.Unlock()
		c.r.hbCloses.Add(1)
		c.close(CloseHeartbeat, "heartbeat missed")
		return
	}
	c.pinged, c.ponged = true, false
	c.r.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), c.r.cfg.PingInterval)
		defer cancel()
		_ = c.ws.Ping(ctx)
	}()
}

// bufPool holds read buffers; big ones are not kept.
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledBuf = 64 << 10

var errFrameTooBig = errors.New("pairing: inbound frame over MaxFrame")

// readLoop reads frames until the socket ends and returns why it ended.
//
// Idle, it waits for the next bytes in sock.wait, called from this small
// frame, rather than deep inside the WebSocket library's reader: an idle
// tab's goroutine then uses little of its stack, which the runtime shrinks
// (to 4 KiB; see docs/PERFORMANCE.md). The wait reads what arrived (a reply
// and the log-append behind it, often) in one system call.
func (c *conn) readLoop() error {
	for {
		if c.bufferEmpty() && c.waitIdle() && c.bufferEmpty() && c.r.park.park(c) {
			return errParked
		}
		if err := c.readFrame(); err != nil {
			return err
		}
		c.reads.Add(1)
		c.lastBeat.Store(time.Now().UnixMilli())
	}
}

// bufferEmpty reports whether no byte (nor a read error) waits in the read
// buffers (only then may the reader wait on the socket itself, or park it). While lapd closes
// the socket the library's close handshake reads the buffer: then it waits
// for that.
func (c *conn) bufferEmpty() bool {
	if c.br == nil {
		return false
	}
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	return c.br.Buffered() == 0 && !c.sock.pending()
}

// waitIdle waits until the socket has something to read (and has read
// it); true means the registry loop found the tab idle meanwhile (kick), so
// it may be parked if nothing was read.
func (c *conn) waitIdle() bool {
	c.mu.Lock()
	if c.closing || c.gone {
		c.mu.Unlock()
		return false
	}
	c.inWait = true
	c.mu.Unlock()
	c.sock.wait()
	c.mu.Lock()
	c.inWait = false
	kicked := c.kicked
	c.kicked = false
	c.mu.Unlock()
	if kicked {
		// The kick set a past read deadline to end the wait; clear it
		// before anything reads (no new kick can come: inWait is false).
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	return kicked
}

// kickIfIdle ends the reader's wait when no frame arrived since the last
// tick, so that it parks. Called by the registry loop only.
func (c *conn) kickIfIdle() {
	n := c.reads.Load()
	idle := n == c.seen
	c.seen = n
	if !idle {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inWait && !c.kicked && !c.closing && !c.gone && c.fd >= 0 {
		c.kicked = true
		_ = c.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// readFrame reads and handles one frame.
//
//go:noinline
func (c *conn) readFrame() error {
	_, rd, err := c.ws.Reader(context.Background())
	if err != nil {
		return err
	}
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, err = buf.ReadFrom(rd)
	kept := false
	if err == nil {
		c.r.framesIn.Add(1)
		c.r.bytesIn.Add(int64(buf.Len()))
		kept = c.handle(buf) // waits for the socket's inbound rates first
	} else if int64(buf.Len()) >= c.r.cfg.MaxFrame {
		err = errFrameTooBig // the library has closed the socket with 1009
	}
	if !kept {
		putReadBuf(buf)
	}
	return err
}

// putReadBuf returns a read buffer to the pool (big ones are dropped).
func putReadBuf(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBuf {
		bufPool.Put(buf)
	}
}
