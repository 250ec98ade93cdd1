package mcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/audit"
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

	MaxSessions                int           // legacy MCP sessions in all [64]
	MaxUnauthenticatedSessions int           // sessions with no connect_session yet; LRU-evicted [16]
	MaxSessionsPerToken        int           // sessions bound to one agt_ token; its LRU is evicted [8]
	IdleTTL                    time.Duration // session dropped after this long unused [30 min]
	UnauthenticatedLifetime    time.Duration // absolute life of a session that never connected [30 min]
	CreateRate                 rate.Limit    // session creations per second per client IP [1]
	CreateBurst                int           // burst of the above [10]
	MaxTrackedIPs              int           // per-IP limiters kept [4096]
	MaxBodyBytes               int64         // request body cap [2 MiB]

	Audit Auditor // refusals (403 origin, 429, 503 capacity); nil = none
	Now   func() time.Time
}

// HTTPHandler is the /agent/mcp endpoint: mcp-go's Streamable HTTP server
// (stateful, both protocol eras, DNS-rebinding protection on) behind an
// Origin check and session bounds.
type HTTPHandler struct {
	cfg      HTTPConfig
	exec     *Executor
	mcp      *mcpserver.StreamableHTTPServer
	sessions *sessionTable

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
	h := &HTTPHandler{cfg: cfg, ips: map[string]*rate.Limiter{}}
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
	s, e, err := NewServer(ec)
	if err != nil {
		return nil, err
	}
	h.exec = e
	h.sessions = &sessionTable{cfg: &h.cfg, m: map[string]*httpSession{}, dropped: e.bindings.DropScope}
	h.mcp = mcpserver.NewStreamableHTTPServer(s,
		mcpserver.WithStateful(true), // DELETE ends a session; 404 after
		mcpserver.WithSessionIdManagerResolver(h.sessions),
		mcpserver.WithStreamableHTTPLogger(e.log),
	)
	return h, nil
}

// Executor returns the executor behind the endpoint.
func (h *HTTPHandler) Executor() *Executor { return h.exec }

// Sessions reports the number of live legacy MCP sessions.
func (h *HTTPHandler) Sessions() int { return h.sessions.len() }

// Close ends open streams (GET listeners). The handler must not be used after.
func (h *HTTPHandler) Close(ctx context.Context) error { return h.mcp.Shutdown(ctx) }

func writeJSONError(w http.ResponseWriter, status int, code string, retryAfter time.Duration) {
	w.Header().Set("Content-Type", "application/json")
	body := map[string]any{"code": code}
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
	detail["ip"] = clientIP(r)
	h.cfg.Audit.Record(r.Context(), audit.Entry{At: h.cfg.Now().UnixMilli(), Event: event, Detail: detail})
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
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
	if rid := r.Header.Get("X-Request-Id"); rid != "" && audit.ValidRequestID(rid) {
		r = r.WithContext(audit.WithRequestID(r.Context(), rid))
	}
	if !h.originAllowed(r) {
		h.audit(r, audit.EventRefused, map[string]any{"status": http.StatusForbidden, "code": "forbidden-origin", "origin": r.Header.Get("Origin")})
		writeJSONError(w, http.StatusForbidden, "forbidden-origin", 0)
		return
	}
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				h.audit(r, audit.EventRefused, map[string]any{"status": http.StatusRequestEntityTooLarge, "code": "payload-too-large"})
				writeJSONError(w, http.StatusRequestEntityTooLarge, "payload-too-large", 0)
				return
			}
			writeJSONError(w, http.StatusBadRequest, "invalid", 0)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		// Only a legacy initialize mints a session. A modern (2026-07-28)
		// request named initialize is a removed method (mcp-go answers 404)
		// and must not spend the caller's session-creation budget.
		if r.Header.Get(mcpserver.HeaderKeySessionID) == "" && isInitialize(body) && !mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) {
			h.allocate(w, r)
			return
		}
	} else if r.Method == http.MethodGet && r.Header.Get(mcpserver.HeaderKeySessionID) == "" && !mcpgo.IsModernProtocol(r.Header.Get(mcpgo.HeaderProtocolVersion)) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"mcp-session-id required"}`+"\n")
		return
	}
	h.mcp.ServeHTTP(w, r)
}

func isInitialize(body []byte) bool {
	var m struct {
		Method string `json:"method"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == string(mcpgo.MethodInitialize)
}

// allocate serves an initialize that will mint a session.
func (h *HTTPHandler) allocate(w http.ResponseWriter, r *http.Request) {
	lim := h.limiter(clientIP(r))
	res := lim.Reserve()
	if d := res.Delay(); d > 0 {
		res.Cancel()
		h.audit(r, audit.EventRateLimited, map[string]any{"reason": "session-create"})
		writeJSONError(w, http.StatusTooManyRequests, "rate-limited", d)
		return
	}
	rv, ok := h.sessions.reserve()
	if !ok {
		h.audit(r, audit.EventRateLimited, map[string]any{"reason": "session-capacity"})
		w.Header().Set("Retry-After", "30")
		writeJSONError(w, http.StatusServiceUnavailable, "session-capacity", 0)
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

// --- session table -------------------------------------------------------

type httpSession struct {
	id            string
	created, used time.Time
	authenticated bool
	tokenKey      string
}

type reservation struct{ used bool }

// sessionTable is mcp-go's SessionIdManager(+Resolver) for the endpoint: it
// mints ids only against a reservation taken by allocate, tracks use, expires
// lazily, and forgets bindings of sessions that end.
type sessionTable struct {
	cfg     *HTTPConfig
	dropped func(scope string) int

	mu         sync.Mutex
	m          map[string]*httpSession
	reserved   int
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
// it still registers the session as unauthenticated, evicting the LRU
// unauthenticated one if needed.
func (m *tableManager) Generate() string {
	t := m.t
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	if m.rv != nil && !m.rv.used {
		m.rv.used = true
		t.reserved--
	} else {
		t.makeRoomLocked(now)
	}
	id := newSessionID()
	t.m[id] = &httpSession{id: id, created: now, used: now}
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
	_, ok := t.m[id]
	if ok {
		t.killLocked(id)
	}
	t.mu.Unlock()
	if ok {
		t.forget([]string{id})
	}
	return false, nil
}

func (t *sessionTable) killLocked(id string) {
	delete(t.m, id)
	if t.dead == nil {
		t.dead = map[string]bool{}
	}
	t.dead[id] = true
	t.tombstones = append(t.tombstones, id)
	if max := 4 * t.cfg.MaxSessions; len(t.tombstones) > max {
		delete(t.dead, t.tombstones[0])
		t.tombstones = t.tombstones[1:]
	}
}

func (t *sessionTable) forget(ids []string) {
	for _, id := range ids {
		t.dropped(id)
	}
}

// sweepLocked expires idle sessions and unauthenticated ones past their life.
func (t *sessionTable) sweepLocked(now time.Time) []string {
	var out []string
	for id, s := range t.m {
		if now.Sub(s.used) > t.cfg.IdleTTL || (!s.authenticated && now.Sub(s.created) > t.cfg.UnauthenticatedLifetime) {
			t.killLocked(id)
			out = append(out, id)
		}
	}
	return out
}

// makeRoomLocked evicts the LRU unauthenticated session when that quota is full.
func (t *sessionTable) makeRoomLocked(now time.Time) []string {
	var unauth []*httpSession
	for _, s := range t.m {
		if !s.authenticated {
			unauth = append(unauth, s)
		}
	}
	if len(unauth)+t.reserved < t.cfg.MaxUnauthenticatedSessions || len(unauth) == 0 {
		return nil
	}
	sort.Slice(unauth, func(i, j int) bool { return unauth[i].used.Before(unauth[j].used) })
	n := len(unauth) + t.reserved - t.cfg.MaxUnauthenticatedSessions + 1
	if n > len(unauth) {
		n = len(unauth)
	}
	var out []string
	for _, s := range unauth[:n] {
		t.killLocked(s.id)
		out = append(out, s.id)
	}
	return out
}

// reserve takes a slot for a new session, or reports capacity.
func (t *sessionTable) reserve() (*reservation, bool) {
	t.mu.Lock()
	now := t.cfg.Now()
	dropped := t.sweepLocked(now)
	dropped = append(dropped, t.makeRoomLocked(now)...)
	ok := len(t.m)+t.reserved < t.cfg.MaxSessions
	if ok {
		t.reserved++
	}
	t.mu.Unlock()
	t.forget(dropped)
	if !ok {
		return nil, false
	}
	return &reservation{}, true
}

// release returns an unused reservation (the initialize failed before Generate).
func (t *sessionTable) release(rv *reservation) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !rv.used {
		rv.used = true
		t.reserved--
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
	var dropped []string
	if extra := len(same) + 1 - t.cfg.MaxSessionsPerToken; extra > 0 {
		sort.Slice(same, func(i, j int) bool { return same[i].used.Before(same[j].used) })
		for _, o := range same[:extra] {
			t.killLocked(o.id)
			dropped = append(dropped, o.id)
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
