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
	"time"

	"github.com/coder/websocket"

	"github.com/lapd-dev/lapd/audit"
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

	mu       sync.Mutex
	q        [][]byte
	inFlight int  // frames taken by the writer, not yet written
	writing  bool // a writer goroutine is running
	closing  bool // close(code) was called
	code     int  // the code we closed with, 0 = the peer or the network did
	gone     bool // the reader has exited; nothing may start goroutines for this conn
	acked    bool // hello-ack sent at least once
	pinged   bool // a ping is outstanding
	ponged   bool // it was answered
	missed   int  // consecutive unanswered pings
}

// closeGrace bounds a server-initiated close handshake.
const closeGrace = time.Second

// hijackRecorder keeps the net.Conn that websocket.Accept hijacks.
type hijackRecorder struct {
	http.ResponseWriter
	nc net.Conn
}

func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	h.nc = nc
	return nc, brw, err
}

// refuse writes the JSON error envelope and audits the refusal.
func (r *Registry) refuse(w http.ResponseWriter, status int, code, detail, tid string) {
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
	r.cfg.Audit.Record(context.Background(), audit.Entry{TID: tid, Event: audit.EventRefused,
		Detail: map[string]any{"endpoint": wsEndpoint, "status": status, "code": code}})
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
		r.refuse(w, http.StatusServiceUnavailable, "shutting-down", "", "")
		return
	}
	defer r.wg.Done()

	if req.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		r.refuse(w, http.StatusMethodNotAllowed, "method-not-allowed", "use GET with a WebSocket upgrade", "")
		return
	}
	if !r.originAllowed(req) {
		r.refuse(w, http.StatusForbidden, "forbidden-origin", "Origin "+strconv.Quote(req.Header.Get("Origin"))+" is not allowed", "")
		return
	}
	token := bearer(req)
	if token == "" {
		r.refuse(w, http.StatusUnauthorized, "auth-failed", "missing token", "")
		return
	}
	if !isUpgrade(req) {
		r.refuse(w, http.StatusBadRequest, "invalid", "expected a WebSocket upgrade", "")
		return
	}
	ctx := req.Context()
	rec, repair, err := r.cfg.Tokens.AcceptTab(ctx, token, protocolValue(req, TabProtocolPrefix))
	switch {
	case errors.Is(err, tokens.ErrTabSecret):
		r.refuse(w, http.StatusUnauthorized, "auth-failed", "this session's socket opens with its tab secret (sub-protocol lapd.tab.<secret>), which only the tab that minted it holds", rec.TID)
		return
	case errors.Is(err, tokens.ErrRevoked):
		r.refuse(w, http.StatusForbidden, "revoked", "token revoked", rec.TID)
		return
	case errors.Is(err, tokens.ErrMalformed), errors.Is(err, tokens.ErrUnknown), errors.Is(err, tokens.ErrExpired):
		r.refuse(w, http.StatusUnauthorized, "auth-failed", "invalid or expired token", rec.TID)
		return
	case err != nil:
		r.cfg.Logger.Error("pairing: accepting a token failed", "err", err)
		r.refuse(w, http.StatusInternalServerError, "internal", "token store unavailable", rec.TID)
		return
	}

	c := &conn{r: r, repair: repair, tab: rec.TabHash != ""}
	hr := &hijackRecorder{ResponseWriter: w}
	ws, err := websocket.Accept(hr, req, &websocket.AcceptOptions{
		Subprotocols: []string{Subprotocol},
		// The Origin check was done above (allowlist or same-origin, with
		// X-Forwarded-* support), so the library's own check is skipped.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
		OnPongReceived:     func(context.Context, []byte) { c.heartbeat() },
	})
	if err != nil {
		r.refused.Add(1)
		r.cfg.Logger.Info("pairing: WebSocket upgrade failed", "tid", rec.TID, "err", err)
		_, _ = r.cfg.Tokens.Disconnected(context.Background(), rec.TID)
		return
	}
	ws.SetReadLimit(r.cfg.MaxFrame)
	c.ws, c.nc = ws, hr.nc
	old, ok := r.register(rec.TID, c)
	if !ok { // Shutdown began meanwhile
		_, _ = r.cfg.Tokens.Disconnected(context.Background(), rec.TID)
		if c.nc != nil {
			_ = c.nc.SetDeadline(time.Now().Add(closeGrace))
		}
		ws.Close(CloseRestart, "server restarting")
		return
	}
	if old != nil {
		r.cfg.Audit.Record(ctx, audit.Entry{TID: rec.TID, UID: rec.UID, Event: audit.EventSupersede,
			Detail: map[string]any{"tabSecret": c.tab, "approvals": !c.noApprove}})
	}
	r.cfg.Audit.Record(ctx, audit.Entry{TID: rec.TID, UID: rec.UID, Event: audit.EventClaim,
		Detail: map[string]any{"transport": "ws", "repair": repair}})
	err = c.readLoop()
	r.connGone(c, err)
}

// register makes c the tid's socket; an older live one is superseded (and
// returned). A socket without the tab secret that supersedes a live one may
// not approve. false when Shutdown began.
func (r *Registry) register(tid string, c *conn) (*conn, bool) {
	now := time.Now().UnixMilli()
	r.mu.Lock()
	if r.shutting {
		r.mu.Unlock()
		return nil, false
	}
	s := r.sessions[tid]
	if s == nil {
		s = &session{tid: tid}
		r.sessions[tid] = s
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
	if !r.loopOn {
		r.loopOn = true
		r.wg.Add(1)
		go r.loop()
	}
	r.mu.Unlock()
	if old != nil {
		old.mu.Lock()
		live := !old.closing && !old.gone
		old.mu.Unlock()
		// Set before c's reader starts, which is the only one to read it.
		c.noApprove = live && !c.tab
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
	if mine {
		// Record the close (token → pending-resume with its grace) before
		// the calls that were in flight on this socket fail, so that their
		// 503 paused carries the grace left, as a call made after the drop
		// would, not the 5 s of a tab that never connected.
		r.afterClose(s.tid, closeReason(code, readErr))
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

// enqueue queues b for the writer; a full queue closes the socket with 4008.
func (c *conn) enqueue(b []byte) error {
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
	if !c.writing {
		c.writing = true
		c.r.wg.Add(1) // legal: the live reader holds a count (c.gone is false)
		go c.writeLoop()
	}
	c.mu.Unlock()
	return nil
}

// writeLoop drains the queue and exits when it is empty.
func (c *conn) writeLoop() {
	defer c.r.wg.Done()
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
			ctx, cancel := context.WithTimeout(context.Background(), c.r.cfg.WriteTimeout)
			err := c.ws.Write(ctx, websocket.MessageText, b)
			cancel()
			if err == nil {
				c.r.framesOut.Add(1)
				c.r.bytesOut.Add(int64(len(b)))
			}
			batch[i] = nil
			if err != nil {
				c.mu.Lock()
				c.writing, c.inFlight, c.q = false, 0, nil
				c.mu.Unlock()
				c.ws.CloseNow() // the reader sees it and cleans up
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
	c.r.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.r.wg.Done()
		// Frames queued before the close (e.g. {t:'revoked'}) go out first,
		// unless the writer is stuck.
		ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		if code == CloseQueueOverflow {
			pending = nil
		}
		for _, b := range pending {
			if c.ws.Write(ctx, websocket.MessageText, b) != nil {
				break
			}
		}
		cancel()
		// A tab that stopped reading never answers the close frame: bound
		// the handshake instead of the library's 5s+5s.
		if c.nc != nil {
			_ = c.nc.SetDeadline(time.Now().Add(closeGrace))
		}
		c.ws.Close(websocket.StatusCode(code), reason)
	}()
}

// heartbeat records a sign of life (a pong, or a {t:'ping'} frame).
func (c *conn) heartbeat() {
	c.mu.Lock()
	c.ponged, c.missed = true, 0
	c.mu.Unlock()
	c.s.mu.Lock()
	c.s.lastHB = time.Now().UnixMilli()
	c.s.mu.Unlock()
}

// loop is the registry-wide heartbeat and sweep loop. It exits on Shutdown or
// when no tid is left.
func (r *Registry) loop() {
	defer r.wg.Done()
	t := time.NewTicker(r.cfg.PingInterval)
	defer t.Stop()
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
		for _, c := range conns {
			c.ping()
		}
	}
}

// ping checks the last ping's answer and sends the next one. The goroutine
// that sends it lives until the pong (about a round trip) or PingInterval.
func (c *conn) ping() {
	c.mu.Lock()
	if c.closing || c.gone {
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
func (c *conn) readLoop() error {
	in := c.r.newInbound()
	for {
		_, rd, err := c.ws.Reader(context.Background())
		if err != nil {
			return err
		}
		buf := bufPool.Get().(*bytes.Buffer)
		buf.Reset()
		_, err = buf.ReadFrom(rd)
		if err == nil {
			c.r.framesIn.Add(1)
			c.r.bytesIn.Add(int64(buf.Len()))
			in.wait(c.r, buf.Len())
			c.handle(buf.Bytes())
		} else if int64(buf.Len()) >= c.r.cfg.MaxFrame {
			err = errFrameTooBig // the library has closed the socket with 1009
		}
		if buf.Cap() <= maxPooledBuf {
			bufPool.Put(buf)
		}
		if err != nil {
			return err
		}
	}
}
