package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/clientip"
	"github.com/lapd-dev/lapd/internal/hostguard"
)

// Auditor records refusals. *audit.Log satisfies it.
type Auditor interface {
	Record(ctx context.Context, e audit.Entry)
}

// HTTPConfig configures the Streamable HTTP endpoint (/agent/mcp). Zero
// values mean the defaults in brackets.
type HTTPConfig struct {
	Config // executor settings; Mode is forced to ModeEndpoint

	// AllowedOrigins lists browser origins (scheme://host[:port]) that may
	// call the endpoint. A request without an Origin header (every non-browser
	// MCP client) and a same-origin request pass; any other Origin gets 403.
	AllowedOrigins []string
	// AllowedHosts are Host names served on a loopback connection besides
	// loopback names; any other Host there gets 403 forbidden-host
	// (DNS-rebinding protection), audited.
	AllowedHosts []string
	// TrustProxy is the number of reverse proxies in front whose
	// X-Forwarded-For names the client (as lap.Config.TrustProxy); 0 = the
	// socket's address. Per-IP limits count IPv6 clients per /64.
	TrustProxy int

	MaxSessions                int           // legacy MCP sessions in all [64]
	MaxUnauthenticatedSessions int           // sessions with no connect_session yet [16]
	MaxSessionsPerToken        int           // sessions bound to one agt_ token; its LRU is evicted [8]
	MaxSessionsPerIP           int           // sessions of one client IP (IPv6: per /64; loopback exempt); its own are evicted first [16]
	IdleTTL                    time.Duration // session dropped after this long unused [30 min]
	UnauthenticatedLifetime    time.Duration // absolute life of a session that never connected [30 min]
	CreateRate                 rate.Limit    // session creations per second per client IP [1]
	CreateBurst                int           // burst of the above [10]
	MaxTrackedIPs              int           // per-IP limiters kept [4096]
	MaxBodyBytes               int64         // request body cap [2 MiB]

	Audit Auditor // refusals (403 origin, 429, 503 capacity); nil = none
	Now   func() time.Time

	// DisableFastPath sends every request through mcp-go. By default a
	// tools/call that mcp-go would answer with a plain JSON result is
	// answered by the fast path (fastpath.go), with the same bytes.
	DisableFastPath bool
}

// HTTPHandler is the /agent/mcp endpoint: mcp-go's Streamable HTTP server
// (stateful, both protocol eras, DNS-rebinding protection on) behind an
// Origin check and session bounds.
type HTTPHandler struct {
	cfg      HTTPConfig
	exec     *Executor
	mcp      *mcpserver.StreamableHTTPServer
	sessions *sessionTable
	splice   bool      // encode results once (splice.go)
	fast     *fastPath // nil = every request through mcp-go
	hosts    *hostguard.Guard

	streams streams // open GET streams per legacy session, ended with it

	ipMu sync.Mutex
	ips  map[string]*rate.Limiter
}

var _ http.Handler = (*HTTPHandler)(nil)

// NewHTTPHandler builds the endpoint. Mount it at /agent/mcp; Close it on shutdown.
func NewHTTPHandler(cfg HTTPConfig) (*HTTPHandler, error) {
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 64
	}
	if cfg.MaxUnauthenticatedSessions <= 0 {
		cfg.MaxUnauthenticatedSessions = 16
	}
	if cfg.MaxSessionsPerToken <= 0 {
		cfg.MaxSessionsPerToken = 8
	}
	if cfg.MaxSessionsPerIP <= 0 {
		cfg.MaxSessionsPerIP = 16
	}
	if cfg.IdleTTL <= 0 {
		cfg.IdleTTL = 30 * time.Minute
	}
	if cfg.UnauthenticatedLifetime <= 0 {
		cfg.UnauthenticatedLifetime = 30 * time.Minute
	}
	if cfg.CreateRate <= 0 {
		cfg.CreateRate = 1
	}
	if cfg.CreateBurst <= 0 {
		cfg.CreateBurst = 10
	}
	if cfg.MaxTrackedIPs <= 0 {
		cfg.MaxTrackedIPs = 4096
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 2 << 20
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &HTTPHandler{cfg: cfg, ips: map[string]*rate.Limiter{}, splice: spliceable(), hosts: hostguard.New(cfg.AllowedHosts)}
	ec := cfg.Config
	ec.Mode = ModeEndpoint
	if ec.Bindings.Now == nil {
		ec.Bindings.Now = cfg.Now
	}
	if ec.Bindings.MaxBindingsPerToken <= 0 {
		ec.Bindings.MaxBindingsPerToken = cfg.MaxSessionsPerToken
	}
	userOnBind := ec.OnBind
	ec.OnBind = func(scope, key string) {
		h.sessions.authenticate(scope, key)
		if userOnBind != nil {
			userOnBind(scope, key)
		}
	}
	fast := &fastPath{}
	hooks := &mcpserver.Hooks{}
	fast.hooks(hooks)
	s, e, err := newServer(ec, mcpserver.WithHooks(hooks))
	if err != nil {
		return nil, err
	}
	h.exec = e
	h.sessions = &sessionTable{cfg: &h.cfg, m: map[string]*httpSession{}, reserved: map[string]int{}, dropped: func(id string) int {
		fast.forget(id)
		h.streams.end(id)
		return e.bindings.DropScope(id)
	}}
	h.mcp = mcpserver.NewStreamableHTTPServer(s,
		mcpserver.WithStateful(true), // DELETE ends a session; 404 after
		// The Host check is ours (ServeHTTP): it also allows the configured
		// public host and answers with the JSON envelope, audited.
		mcpserver.WithDisableLocalhostProtection(true),
		mcpserver.WithSessionIdManagerResolver(h.sessions),
		mcpserver.WithStreamableHTTPLogger(e.log),
	)
	if !cfg.DisableFastPath && h.splice {
		if err := fast.init(ec, e, s, h.mcp, h.sessions); err != nil {
			e.log.Warn("mcp: the tools/call fast path is off: mcp-go encodes responses in a way it does not expect", "err", err)
		} else {
			h.fast = fast
			e.notified = fast.noteNotified
		}
	}
	return h, nil
}

// FastPath reports whether plain tools/call requests take the fast path
// (fastpath.go): false with DisableFastPath, or when its start-up probe
// found an encoding of mcp-go's it does not expect.
func (h *HTTPHandler) FastPath() bool { return h.fast != nil }

// Executor returns the executor behind the endpoint.
func (h *HTTPHandler) Executor() *Executor { return h.exec }

// Sessions reports the number of live legacy MCP sessions.
func (h *HTTPHandler) Sessions() int { return h.sessions.len() }

// Close ends open streams (GET listeners). The handler must not be used after.
func (h *HTTPHandler) Close(ctx context.Context) error { return h.mcp.Shutdown(ctx) }

func writeJSONError(w http.ResponseWriter, status int, code string, retryAfter time.Duration, detail string) {
	w.Header().Set("Content-Type", "application/json")
	body := map[string]any{"code": code, "detail": detail}
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(seconds(retryAfter)))
		body["retryAfterMs"] = retryAfter.Milliseconds()
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": body})
}

func (h *HTTPHandler) audit(r *http.Request, event string, detail map[string]any) {
	if h.cfg.Audit == nil {
		return
	}
	detail["endpoint"] = "/agent/mcp"
	detail["ip"] = clientip.Of(r, h.cfg.TrustProxy)
	e := audit.Entry{At: h.cfg.Now().UnixMilli(), Event: event, Detail: detail}
	// Refusals only: within the client's audit budget when the Auditor has
	// one (*audit.Log: a flood becomes one counted entry per interval).
	if l, ok := h.cfg.Audit.(interface {
		RecordLimited(ctx context.Context, source string, e audit.Entry)
	}); ok {
		l.RecordLimited(r.Context(), "ip:"+clientip.KeyOf(r, h.cfg.TrustProxy), e)
		return
	}
	h.cfg.Audit.Record(r.Context(), e)
}

func (h *HTTPHandler) originAllowed(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	for _, a := range h.cfg.AllowedOrigins {
		if strings.EqualFold(strings.TrimRight(a, "/"), o) {
			return true
		}
	}
	return h.sameOrigin(r, o)
}

// sameOrigin reports whether origin o is the request's own.
func (h *HTTPHandler) sameOrigin(r *http.Request, o string) bool {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return strings.EqualFold(o, scheme+"://"+r.Host)
}

type reservationKey struct{}

// ServeHTTP checks Origin, gates session creation (per-IP rate, capacity),
// then hands the request to mcp-go.
func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.hosts.Allowed(r) {
		h.audit(r, audit.EventRefused, map[string]any{"status": http.StatusForbidden, "code": "forbidden-host", "host": r.Host})
		writeJSONError(w, http.StatusForbidden, "forbidden-host", 0, "Host "+strconv.Quote(r.Host)+" is not served on this loopback address (DNS-rebinding protection); use localhost or 127.0.0.1, or add the name with lapd serve --hosts")
		return
	}
	if rid := r.Header.Get("X-Request-Id"); rid != "" && audit.ValidRequestID(rid) {
		r = r.WithContext(audit.WithRequestID(r.Context(), rid))
	}
	if !h.originAllowed(r) {
		h.audit(r, audit.EventRefused, map[string]any{"status": http.StatusForbidden, "code": "forbidden-origin", "origin": r.Header.Get("Origin")})
		writeJSONError(w, http.StatusForbidden, "forbidden-origin", 0, "Origin "+strconv.Quote(r.Header.Get("Origin"))+" may not use this MCP endpoint; a page on another origin needs lapd serve --origins (Config.Origins), MCP clients send no Origin")
		return
	}
	switch r.Method {
	case http.MethodPost, http.MethodGet, http.MethodDelete, http.MethodHead:
		h.cors(w, r, false)
	case http.MethodOptions:
		// A browser's preflight (an allowed origin: the check above
		// refused the others); without one, the methods served.
		w.Header().Set("Allow", mcpMethods)
		h.cors(w, r, true)
		w.WriteHeader(http.StatusNoContent)
		return
	default:
		// mcp-go answers any other method 404 (text/plain), which reads as
		// "no endpoint here".
		w.Header().Set("Allow", mcpMethods)
		writeJSONError(w, http.StatusMethodNotAllowed, "method-not-allowed", 0, "the MCP endpoint takes POST (JSON-RPC messages), GET (the server's event stream) and DELETE (end the session); send the request with one of them")
		return
	}
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				h.audit(r, audit.EventRefused, map[string]any{"status": http.StatusRequestEntityTooLarge, "code": "payload-too-large"})
				writeJSONError(w, http.StatusRequestEntityTooLarge, "payload-too-large", 0, "the request body is over "+humanBytes(int(h.cfg.MaxBodyBytes))+", this endpoint's limit; send a smaller request")
				return
			}
			writeJSONError(w, http.StatusBadRequest, "invalid", 0, "the request body could not be read; send it again")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if msg, ok := notOneMessage(body); !ok {
			writeJSONRPCError(w, http.StatusBadRequest, nil, mcpgo.INVALID_REQUEST, msg)
			return
		}
		// The fast path takes only a tools/call (never an initialize), so
		// it goes first and spares its requests the check below.
		if h.fast != nil && h.fast.serve(w, r, body) {
			return
		}
		// Only a legacy initialize mints a session. A modern (2026-07-28)
		// request named initialize is a removed method (mcp-go answers 404)
		// and must not spend the caller's session-creation budget.
		if r.Header.Get(mcpserver.HeaderKeySessionID) == "" && !modernRequest(r, body) {
			if isInitialize(body) {
				h.allocate(w, r)
				return
			}
			// A legacy message outside a session: 400, as the spec asks of
			// a server that requires sessions (mcp-go said 404 "Invalid
			// session ID", which tells a client its session expired).
			writeJSONRPCError(w, http.StatusBadRequest, requestID(body), mcpgo.INVALID_REQUEST,
				"Mcp-Session-Id header required: send initialize first and carry the Mcp-Session-Id it returns on every later request (protocol 2025-11-25 and earlier), or send MCP-Protocol-Version 2026-07-28 with the version in params._meta (no session)")
			return
		}
		if h.fast != nil {
			if isCancelledNotification(body) {
				sr := &statusRecorder{ResponseWriter: w}
				h.mcp.ServeHTTP(sr, r)
				if sr.status == http.StatusAccepted {
					h.fast.cancelled(r, body)
				}
				return
			}
		}
		if h.splice {
			sp := &splicer{}
			w = &spliceWriter{ResponseWriter: w, sp: sp}
			r = r.WithContext(withSplicer(r.Context(), sp))
		}
	} else if (r.Method == http.MethodGet || r.Method == http.MethodDelete) && r.Header.Get(mcpserver.HeaderKeySessionID) == "" && !mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		if r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
			// Someone opened the URL from lapd's banner in a browser: the
			// reference's answer plus what the URL is for.
			_, _ = io.WriteString(w, `{"error":"mcp-session-id required","detail":"this is lapd's MCP endpoint, for MCP clients, not browsers: add this URL to one (claude mcp add --transport http lapd <this URL>), then give the model the connect line the app shows"}`+"\n")
			return
		}
		_, _ = io.WriteString(w, `{"error":"mcp-session-id required"}`+"\n")
		return
	}
	// In the stateful era, a session id this endpoint does not hold (never
	// minted, DELETEd, evicted, expired) is 404 on every method, as the MCP
	// spec asks (the client then initializes again). mcp-go checks it only
	// on a POST, and answers in text/plain: a GET opened a stream for it and
	// a DELETE said 200. (The modern era has no sessions: an id is ignored.)
	if id := r.Header.Get(mcpserver.HeaderKeySessionID); id != "" && !mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) && !h.sessions.known(id) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":"session not found"}`+"\n")
		return
	}
	if id := r.Header.Get(mcpserver.HeaderKeySessionID); r.Method == http.MethodGet && id != "" && !mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) {
		// mcp-go ends a GET stream only when the client goes or the server
		// shuts down: a DELETEd, evicted or expired session kept its
		// stream (and connection) open for ever. Registered before the
		// second look, so a DELETE racing this GET ends it either way.
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer h.streams.add(id, cancel)()
		if !h.sessions.known(id) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"session not found"}`+"\n")
			return
		}
		r = r.WithContext(ctx)
	}
	h.mcp.ServeHTTP(w, r)
}

// streams are the open GET streams of legacy sessions.
type streams struct {
	mu sync.Mutex
	m  map[string]map[*context.CancelFunc]bool
}

// add registers a stream of session id, ending the ones it had: a session
// has one GET stream (a client that opens another has given up the one
// before). Without that, one session's streams, which cost nothing while
// they last, held every connection a client address may keep (256 on
// loopback, so every other local client got 503 too-many-connections). The
// returned func unregisters it.
func (s *streams) add(id string, cancel context.CancelFunc) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m[id] {
		(*c)()
	}
	if s.m == nil {
		s.m = map[string]map[*context.CancelFunc]bool{}
	}
	if s.m[id] == nil {
		s.m[id] = map[*context.CancelFunc]bool{}
	}
	k := &cancel
	s.m[id][k] = true
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.m[id], k)
		if len(s.m[id]) == 0 {
			delete(s.m, id)
		}
	}
}

// end ends every stream of session id.
func (s *streams) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.m[id] {
		(*c)()
	}
}

// known reports whether id is a live session of the table (and marks it
// used).
func (t *sessionTable) known(id string) bool {
	t.mu.Lock()
	now := t.cfg.Now()
	dropped := t.sweepLocked(now)
	s := t.m[id]
	if s != nil {
		s.used = now
	}
	t.mu.Unlock()
	t.forget(dropped)
	return s != nil
}

// mcpMethods are the HTTP methods the endpoint serves (Allow).
const mcpMethods = "GET, POST, DELETE, OPTIONS"

// cors adds the CORS headers for a cross-origin browser request from an
// allowed origin (originAllowed let it through; same-origin requests and
// clients without an Origin need none). preflight adds what an OPTIONS
// answer needs. Without them a page on an origin of --origins could send
// nothing but a form post: every MCP request is a JSON POST (preflighted),
// and the session id is in a response header the page could not read.
func (h *HTTPHandler) cors(w http.ResponseWriter, r *http.Request, preflight bool) {
	o := r.Header.Get("Origin")
	if o == "" || h.sameOrigin(r, o) {
		return
	}
	hd := w.Header()
	hd.Set("Access-Control-Allow-Origin", o)
	hd.Add("Vary", "Origin")
	if preflight {
		hd.Set("Access-Control-Allow-Methods", mcpMethods)
		hd.Set("Access-Control-Allow-Headers", "Content-Type, Accept, Authorization, Mcp-Session-Id, MCP-Protocol-Version, Mcp-Method, Mcp-Name, Last-Event-ID, X-Request-Id")
		hd.Set("Access-Control-Max-Age", "600")
		return
	}
	hd.Set("Access-Control-Expose-Headers", "Mcp-Session-Id, Retry-After, WWW-Authenticate, X-Request-Id")
}

// writeJSONRPCError writes a JSON-RPC error response (id nil = null).
func writeJSONRPCError(w http.ResponseWriter, status int, id any, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	type details struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	_ = json.NewEncoder(w).Encode(struct {
		JSONRPC string  `json:"jsonrpc"`
		ID      any     `json:"id"`
		Error   details `json:"error"`
	}{mcpgo.JSONRPC_VERSION, id, details{code, msg}})
}

// notOneMessage reports (with ok false) a body that is valid JSON but not
// one JSON-RPC message object: mcp-go answers those -32700 "not valid
// json", which sends a client looking for a syntax error. A batch (an
// array) was allowed only by protocol 2025-03-26; lapd serves each message
// in its own POST (docs/PROTOCOL.md). Invalid JSON is left to mcp-go
// (-32700 is right for it).
func notOneMessage(body []byte) (string, bool) {
	b := bytes.TrimLeft(body, " \t\r\n")
	if len(b) == 0 || b[0] == '{' || !json.Valid(b) {
		return "", true
	}
	if b[0] == '[' {
		return "JSON-RPC batches are not supported: send each request in its own POST", false
	}
	return "the body must be one JSON-RPC message object, like {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}", false
}

// modernRequest reports whether r is a 2026-07-28 (stateless) request, as
// mcp-go decides it: by the MCP-Protocol-Version header or the version in
// params._meta.
func modernRequest(r *http.Request, body []byte) bool {
	if mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) {
		return true
	}
	if !bytes.Contains(body, []byte(mcpgo.MetaKeyProtocolVersion)) {
		return false
	}
	var m struct {
		Params struct {
			Meta *mcpgo.Meta `json:"_meta"`
		} `json:"params"`
	}
	return json.Unmarshal(body, &m) == nil && mcpgo.IsModernProtocol(m.Params.Meta.ProtocolVersion())
}

// requestID is the id of a JSON-RPC request body (nil when it has none or
// it is not a string or a number).
func requestID(body []byte) any {
	var m struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	switch m.ID.(type) {
	case string, float64:
		return m.ID
	}
	return nil
}

func isInitialize(body []byte) bool {
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == string(mcpgo.MethodInitialize)
}

// allocate serves an initialize that will mint a session.
func (h *HTTPHandler) allocate(w http.ResponseWriter, r *http.Request) {
	addr := clientip.Of(r, h.cfg.TrustProxy)
	ip := clientip.Key(addr)
	lim := h.limiter(ip)
	res := lim.Reserve()
	if d := res.Delay(); d > 0 {
		res.Cancel()
		h.audit(r, audit.EventRateLimited, map[string]any{"reason": "session-create"})
		writeJSONError(w, http.StatusTooManyRequests, "rate-limited", d, "too many new MCP sessions from this address; wait "+strconv.Itoa(seconds(d))+" s (Retry-After), or reuse the session you have")
		return
	}
	rv, evicted, ok := h.sessions.reserve(ip, isLoopback(addr))
	for _, ev := range evicted {
		h.exec.log.Info("mcp: session evicted to make room", "session", ev.id, "ip", ev.ip, "connected", ev.authenticated, "for_ip", ip)
	}
	if !ok {
		h.audit(r, audit.EventRateLimited, map[string]any{"reason": "session-capacity"})
		w.Header().Set("Retry-After", "30")
		writeJSONError(w, http.StatusServiceUnavailable, "session-capacity", 0, "every MCP session slot is being initialized right now; retry in 30 s (Retry-After)")
		return
	}
	defer h.sessions.release(rv)
	h.mcp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), reservationKey{}, rv)))
}

func (h *HTTPHandler) limiter(ip string) *rate.Limiter {
	h.ipMu.Lock()
	defer h.ipMu.Unlock()
	l := h.ips[ip]
	if l == nil {
		if len(h.ips) >= h.cfg.MaxTrackedIPs {
			clear(h.ips) // bounded memory; a reset only ever lets callers through
		}
		l = rate.NewLimiter(h.cfg.CreateRate, h.cfg.CreateBurst)
		h.ips[ip] = l
	}
	return l
}

// isLoopback reports whether addr is a loopback address.
func isLoopback(addr string) bool {
	a, err := netip.ParseAddr(strings.Trim(addr, "[]"))
	return err == nil && a.Unmap().IsLoopback()
}

// --- session table -------------------------------------------------------

// The table is fair by construction. Every session belongs to a client IP
// (IPv6: its /64) and, once connect_session binds it, to a token. Making
// room for a new session never refuses it while anything can be evicted,
// and the one evicted is always taken from the biggest holder:
//
//  1. over MaxUnauthenticatedSessions, a session that never connected goes:
//     the least recently used one of the IP holding the most of them;
//  2. a client IP at MaxSessionsPerIP pays with one of its own sessions;
//  3. a full table evicts from the IP holding the most sessions.
//
// Within an IP the victim is a session that never connected if there is
// one, else the least recently used session of the token with the most
// sessions (among equals, the one whose least recently used session is
// oldest). So one IP with a handful of anonymous tokens holds at most
// MaxSessionsPerIP of MaxSessions, and a client from elsewhere always gets
// a slot. Loopback clients are exempt from the cap per IP: they are everyone
// on the machine, and the cap would only shrink the table for all of them;
// among them the cap per token (MaxSessionsPerToken) and "biggest token
// first" keep one token's sessions from crowding out another's.

type httpSession struct {
	id            string
	ip            string // clientip key
	created, used time.Time
	authenticated bool
	tokenKey      string
}

type reservation struct {
	ip       string
	loopback bool
	used     bool
}

// sessionTable is mcp-go's SessionIdManager(+Resolver) for the endpoint: it
// mints ids only against a reservation taken by allocate, tracks use, expires
// lazily, and forgets bindings of sessions that end.
type sessionTable struct {
	cfg     *HTTPConfig
	dropped func(scope string) int

	mu         sync.Mutex
	m          map[string]*httpSession
	reserved   map[string]int // reservations not yet turned into sessions, per IP
	nreserved  int
	tombstones []string // DELETEd or evicted ids, so they answer 404 (bounded)
	dead       map[string]bool
}

func (t *sessionTable) ResolveSessionIdManager(r *http.Request) mcpserver.SessionIdManager {
	var rv *reservation
	if r != nil { // mcp-go passes nil outside a request (Shutdown)
		rv, _ = r.Context().Value(reservationKey{}).(*reservation)
	}
	return &tableManager{t: t, rv: rv}
}

type tableManager struct {
	t  *sessionTable
	rv *reservation
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "mcp-session-" + hex.EncodeToString(b[:])
}

// Generate mints an id. Without a reservation (a path allocate did not gate)
// it still registers the session as unauthenticated, making room as reserve
// does.
func (m *tableManager) Generate() string {
	t := m.t
	t.mu.Lock()
	now := t.cfg.Now()
	ip := ""
	var dropped []*httpSession
	if m.rv != nil && !m.rv.used {
		m.rv.used = true
		ip = m.rv.ip
		t.unreserveLocked(ip)
	} else {
		dropped, _ = t.makeRoomLocked(now, ip, false)
	}
	id := newSessionID()
	t.m[id] = &httpSession{id: id, ip: ip, created: now, used: now}
	t.mu.Unlock()
	t.forget(dropped)
	return id
}

func (m *tableManager) Validate(id string) (bool, error) {
	t := m.t
	t.mu.Lock()
	now := t.cfg.Now()
	dropped := t.sweepLocked(now)
	s := t.m[id]
	dead := t.dead[id]
	if s != nil {
		s.used = now
	}
	t.mu.Unlock()
	t.forget(dropped)
	switch {
	case s != nil:
		return false, nil
	case dead:
		return true, nil
	default:
		return false, errors.New("session not found")
	}
}

func (m *tableManager) Terminate(id string) (bool, error) {
	t := m.t
	t.mu.Lock()
	s := t.m[id]
	if s != nil {
		t.killLocked(s)
	}
	t.mu.Unlock()
	if s != nil {
		t.forget([]*httpSession{s})
	}
	return false, nil
}

func (t *sessionTable) killLocked(s *httpSession) {
	delete(t.m, s.id)
	if t.dead == nil {
		t.dead = map[string]bool{}
	}
	t.dead[s.id] = true
	t.tombstones = append(t.tombstones, s.id)
	if max := 4 * t.cfg.MaxSessions; len(t.tombstones) > max {
		delete(t.dead, t.tombstones[0])
		t.tombstones = t.tombstones[1:]
	}
}

func (t *sessionTable) forget(ss []*httpSession) {
	for _, s := range ss {
		t.dropped(s.id)
	}
}

func (t *sessionTable) unreserveLocked(ip string) {
	t.nreserved--
	if t.reserved[ip]--; t.reserved[ip] <= 0 {
		delete(t.reserved, ip)
	}
}

// sweepLocked expires idle sessions and unauthenticated ones past their life.
func (t *sessionTable) sweepLocked(now time.Time) []*httpSession {
	var out []*httpSession
	for _, s := range t.m {
		if now.Sub(s.used) > t.cfg.IdleTTL || (!s.authenticated && now.Sub(s.created) > t.cfg.UnauthenticatedLifetime) {
			t.killLocked(s)
			out = append(out, s)
		}
	}
	return out
}

// count is how many sessions (plus reservations) match, per IP.
func (t *sessionTable) countLocked(match func(*httpSession) bool, withReserved bool) (map[string]int, int) {
	per := map[string]int{}
	n := 0
	for _, s := range t.m {
		if match(s) {
			per[s.ip]++
			n++
		}
	}
	if withReserved {
		for ip, r := range t.reserved {
			per[ip] += r
			n += r
		}
	}
	return per, n
}

// biggestLocked is the IP holding the most of per (ties: the one whose least
// recently used matching session is oldest, then the smaller key).
func (t *sessionTable) biggestLocked(per map[string]int, match func(*httpSession) bool) string {
	best, bestN := "", -1
	var bestLRU time.Time
	for ip, n := range per {
		lru := t.lruLocked(func(s *httpSession) bool { return s.ip == ip && match(s) })
		if lru == nil {
			continue // only reservations: nothing to evict there
		}
		if n > bestN || (n == bestN && (lru.used.Before(bestLRU) || (lru.used.Equal(bestLRU) && ip < best))) {
			best, bestN, bestLRU = ip, n, lru.used
		}
	}
	return best
}

func (t *sessionTable) lruLocked(match func(*httpSession) bool) *httpSession {
	var out *httpSession
	for _, s := range t.m {
		if match(s) && (out == nil || s.used.Before(out.used) || (s.used.Equal(out.used) && s.id < out.id)) {
			out = s
		}
	}
	return out
}

// victimLocked picks the session to evict from ip: one that never connected
// if any, else the least recently used one of ip's biggest token group.
func (t *sessionTable) victimLocked(ip string) *httpSession {
	if s := t.lruLocked(func(s *httpSession) bool { return s.ip == ip && !s.authenticated }); s != nil {
		return s
	}
	per := map[string]int{}
	lru := map[string]*httpSession{}
	for _, s := range t.m {
		if s.ip == ip {
			per[s.tokenKey]++
			if l := lru[s.tokenKey]; l == nil || s.used.Before(l.used) || (s.used.Equal(l.used) && s.id < l.id) {
				lru[s.tokenKey] = s
			}
		}
	}
	// The token with the most sessions; among equals, the one whose least
	// recently used session is oldest.
	var victim *httpSession
	n := -1
	for k, c := range per {
		l := lru[k]
		if c > n || (c == n && (l.used.Before(victim.used) || (l.used.Equal(victim.used) && l.id < victim.id))) {
			victim, n = l, c
		}
	}
	return victim
}

// makeRoomLocked evicts what a new session from ip needs (see the rules
// above) and reports whether a slot is free for it.
func (t *sessionTable) makeRoomLocked(now time.Time, ip string, loopback bool) ([]*httpSession, bool) {
	var out []*httpSession
	evict := func(s *httpSession) {
		t.killLocked(s)
		out = append(out, s)
	}
	unauth := func(s *httpSession) bool { return !s.authenticated }
	all := func(*httpSession) bool { return true }
	// 1. sessions that never connected
	if per, n := t.countLocked(unauth, true); n >= t.cfg.MaxUnauthenticatedSessions {
		if big := t.biggestLocked(per, unauth); big != "" {
			evict(t.lruLocked(func(s *httpSession) bool { return s.ip == big && unauth(s) }))
		}
	}
	// 2. this IP's share
	for !loopback {
		if per, _ := t.countLocked(all, true); per[ip] < t.cfg.MaxSessionsPerIP {
			break
		}
		v := t.victimLocked(ip)
		if v == nil {
			break // only its own initializes in flight
		}
		evict(v)
	}
	// 3. the whole table
	for {
		per, n := t.countLocked(all, true)
		if n < t.cfg.MaxSessions {
			return out, true
		}
		big := t.biggestLocked(per, all)
		if big == "" {
			return out, false // every slot is a reservation in flight
		}
		evict(t.victimLocked(big))
	}
}

// reserve takes a slot for a new session from ip, evicting as needed (the
// evicted are returned, for the log). false only when every slot is taken by
// initializes still in flight.
func (t *sessionTable) reserve(ip string, loopback bool) (*reservation, []*httpSession, bool) {
	t.mu.Lock()
	now := t.cfg.Now()
	dropped := t.sweepLocked(now)
	evicted, ok := t.makeRoomLocked(now, ip, loopback)
	if ok {
		if t.reserved == nil {
			t.reserved = map[string]int{}
		}
		t.reserved[ip]++
		t.nreserved++
	}
	t.mu.Unlock()
	t.forget(dropped)
	t.forget(evicted)
	if !ok {
		return nil, evicted, false
	}
	return &reservation{ip: ip, loopback: loopback}, evicted, true
}

// release returns an unused reservation (the initialize failed before Generate).
func (t *sessionTable) release(rv *reservation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !rv.used {
		rv.used = true
		t.unreserveLocked(rv.ip)
	}
}

// authenticate marks a session as connected with a token and applies the
// per-token cap by evicting that token's least recently used sessions.
func (t *sessionTable) authenticate(id, key string) {
	if id == "" {
		return
	}
	t.mu.Lock()
	s := t.m[id]
	if s == nil {
		t.mu.Unlock()
		return
	}
	s.authenticated, s.tokenKey = true, key
	var same []*httpSession
	for _, o := range t.m {
		if o.tokenKey == key && o.id != id {
			same = append(same, o)
		}
	}
	var dropped []*httpSession
	if extra := len(same) + 1 - t.cfg.MaxSessionsPerToken; extra > 0 {
		sort.Slice(same, func(i, j int) bool { return same[i].used.Before(same[j].used) })
		for _, o := range same[:extra] {
			t.killLocked(o)
			dropped = append(dropped, o)
		}
	}
	t.mu.Unlock()
	t.forget(dropped)
}

func (t *sessionTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
