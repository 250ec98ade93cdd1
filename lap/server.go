// Package lap is lapd's HTTP face: the meta routes a browser app calls
// (mint, resume, revoke, sessions) and the LAP v2 routes an LLM bridge calls
// (/agent/lap/v1/observe, /message, ...), with the reference's gates, error
// envelope and status codes, plus lapd's additions (docs/PROTOCOL.md).
//
// Most programs get a Server from lapd.New, which wires every part. By hand,
// build it from the other parts and mount its Handler:
//
//	srv, err := lap.New(lap.Config{Tokens: tm, Registry: reg, Confirm: cm, Audit: al})
//	mux.Handle("/agent/", srv.Handler())
//	mux.Handle("/agent/ws", reg)
//
// Every LAP route goes through the same gate, in the reference's order:
// declared size (413), bearer (401/403), record re-read (403 revoked), paired
// tab (503 paused + X-LLui-Reconnect/Retry-After), per-tid rate limit (429 +
// Retry-After), body size while reading (413). The handler then usually makes
// one RPC to the tab through the pairing registry; its raw JSON result is
// spliced into the response, never decoded and re-encoded (the hot path).
// Every refusal is audited.
//
// lapd adds server-side policy enforcement (the tab's hello.policy compiled by
// the schema package, checked before a /message or /would-dispatch frame
// reaches the tab), idempotent /message (idempotencyKey), tab health in
// /observe, CORS with an allowlist on the meta routes, and Drain for graceful
// restarts.
//
// The Client interface is how the mcp package reaches LAP: NewHTTPClient over
// the network, or (*Server).Client in-process through the very same handler.
package lap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/internal/clientip"
	"github.com/lapd-dev/lapd/pairing"
	"github.com/lapd-dev/lapd/tokens"
)

// Defaults.
const (
	DefaultPrefix         = "/agent"
	DefaultBasePath       = DefaultPrefix + "/lap/v1"
	DefaultMaxBody        = 1 << 20
	DefaultIdempotencyTTL = 10 * time.Minute
	// MaxTimeout caps every caller-supplied timeoutMs (/message, /wait, /confirm-result).
	MaxTimeout = 2 * time.Minute
)

// DefaultRate is the reference's "30/minute" with a burst of 30.
var DefaultRate = rate.Every(2 * time.Second)

// Config configures a Server. Zero values mean the documented defaults.
type Config struct {
	Tokens   *tokens.Manager   // required
	Registry *pairing.Registry // required
	Confirm  *confirm.Manager  // required
	Audit    *audit.Log        // nil = no audit
	Logger   *slog.Logger      // nil = discard

	Prefix   string // path prefix of the meta routes and of the WebSocket URL handed out by mint; default "/agent"; "/" = the root
	BasePath string // LAP base path; default Prefix+"/lap/v1"
	MaxBody  int64  // LAP request body cap; default 1 MiB

	LAPRate     rate.Limit // per-tid LAP calls; default 30/min
	LAPBurst    int        // default 30
	MintRate    rate.Limit // per uid (or client IP when anonymous) for mint and resume/claim; default 30/min
	MintBurst   int        // default 30
	MaxRateKeys int        // keys per limiter; default 100,000 (over it the least recently used key is forgotten)

	Identity       IdentityResolver // nil = everyone is anonymous
	AllowAnonymous bool             // mint without an identity; default false (401 auth-required)
	CORSOrigins    []string         // exact origins allowed to call the meta routes cross-origin
	TrustProxy     int              // number of trusted proxies: X-Forwarded-For/-Proto/-Host are read only when > 0
	PublicURL      string           // public origin (https://app.example.com) for mint/claim URLs and origins; "" = from each request

	PolicyCacheBytes int // compiled hello.policy kept (shared by tabs sending the same one); default 64 MiB

	IdempotencyTTL  time.Duration    // how long a /message idempotencyKey is remembered; default 10m
	MaxIdemKeys     int              // keys remembered per tid; default 1,000
	IdemBytesPerTID int              // bytes of remembered /message bodies per tid; default 16 MiB
	IdemBytes       int              // bytes of remembered /message bodies in all; default 128 MiB
	Clock           func() time.Time // default time.Now

	Observer Observer // told about every call and RPC (metrics); nil = none
}

// Server serves the meta and LAP routes. Safe for concurrent use.
type Server struct {
	cfg      Config
	log      *slog.Logger
	lapRate  *limiter
	mintRate *limiter
	idem     *idempotency
	policies *policyCache
	descs    descCache
	cors     map[string]bool
	handler  http.Handler

	tabsMu sync.Mutex
	tabs   map[string]struct{}

	tabGone tabGone // approval waits end when the tab's socket closes
	// testApprovalWait, set by tests only, runs when an approval wait is
	// about to start.
	testApprovalWait atomic.Pointer[func()]
	skew             skewSet // tids whose tab was refused for its LAP version

	// lapRateText and mintRateText say the rate limits in 429 details.
	lapRateText, mintRateText string

	shedLogMu sync.Mutex
	shedLogAt time.Time

	failLogMu  sync.Mutex
	failLogAt  time.Time
	failUnlogd int // failures since the last line

	mu       sync.Mutex
	inflight int
	draining bool
	idle     chan struct{}

	// drainCtx is cancelled by Drain: long polls end early so that a
	// shutdown never waits out a /wait or an approval.
	drainCtx    context.Context
	drainCancel context.CancelFunc
}

// New checks cfg, installs the server's pairing hooks on cfg.Registry and
// returns the Server.
func New(cfg Config) (*Server, error) {
	if cfg.Tokens == nil || cfg.Registry == nil || cfg.Confirm == nil {
		return nil, errors.New("lap: Config needs Tokens, Registry and Confirm")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	cfg.Prefix = strings.TrimRight("/"+strings.Trim(cfg.Prefix, "/"), "/")
	if cfg.BasePath == "" {
		cfg.BasePath = cfg.Prefix + "/lap/v1"
	}
	cfg.BasePath = "/" + strings.Trim(cfg.BasePath, "/")
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("lap: PublicURL %q must be an http(s) origin", cfg.PublicURL)
		}
		cfg.PublicURL = u.Scheme + "://" + u.Host
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.LAPRate == 0 {
		cfg.LAPRate = DefaultRate
	}
	if cfg.LAPBurst <= 0 {
		cfg.LAPBurst = 30
	}
	if cfg.MintRate == 0 {
		cfg.MintRate = DefaultRate
	}
	if cfg.MintBurst <= 0 {
		cfg.MintBurst = 30
	}
	if cfg.IdempotencyTTL <= 0 {
		cfg.IdempotencyTTL = DefaultIdempotencyTTL
	}
	if cfg.MaxIdemKeys <= 0 {
		cfg.MaxIdemKeys = 1000
	}
	if cfg.IdemBytesPerTID <= 0 {
		cfg.IdemBytesPerTID = DefaultIdemBytesPerTID
	}
	if cfg.IdemBytes <= 0 {
		cfg.IdemBytes = DefaultIdemBytes
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.TrustProxy < 0 {
		return nil, errors.New("lap: TrustProxy must be ≥ 0")
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		lapRate:  newLimiter(cfg.LAPRate, cfg.LAPBurst, cfg.MaxRateKeys, cfg.Clock),
		mintRate: newLimiter(cfg.MintRate, cfg.MintBurst, cfg.MaxRateKeys, cfg.Clock),
		idem:     newIdempotency(cfg.IdempotencyTTL, cfg.MaxIdemKeys, cfg.IdemBytesPerTID, cfg.IdemBytes, cfg.Clock),
		policies: newPolicyCache(cfg.PolicyCacheBytes),
		cors:     map[string]bool{},
		idle:     make(chan struct{}),
		tabs:     map[string]struct{}{},
	}
	s.drainCtx, s.drainCancel = context.WithCancel(context.Background())
	s.lapRateText = "this session (its token) may make " + rateText(cfg.LAPRate, cfg.LAPBurst, "calls")
	s.mintRateText = rateText(cfg.MintRate, cfg.MintBurst, "mints and resume/claims") + " per signed-in user (per client address when anonymous)"
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for _, o := range cfg.CORSOrigins {
		s.cors[strings.TrimRight(o, "/")] = true
	}
	s.handler = http.HandlerFunc(s.serveHTTP)
	s.idem.onShed = func(tid string, n int) { s.logShed("idempotency", tid, n) }
	s.policies.onEvict = func(n int) { s.logShed("compiled policy", "", n) }
	cfg.Registry.SetHooks(pairing.Hooks{
		OnPaired:          s.onTabPaired,
		OnClosed:          s.onTabClosed,
		OnVersionSkew:     s.skew.add,
		OnConfirmResolved: s.onConfirmResolved,
		OnLogAppend:       s.onLogAppend,
		OnAdmit:           s.lapRate.allow,
	})
	return s, nil
}

// Handler serves the meta routes under Prefix (/agent/mint, …) and the LAP
// routes under BasePath; anything else is a JSON 404. It expects the full
// request path (mount it without http.StripPrefix).
func (s *Server) Handler() http.Handler { return s.handler }

// Prefix is the meta routes' prefix in use ("/agent" by default).
func (s *Server) Prefix() string { return s.cfg.Prefix }

// BasePath is the LAP base path in use.
func (s *Server) BasePath() string { return s.cfg.BasePath }

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if tail, ok := strings.CutPrefix(path, s.cfg.BasePath+"/"); ok {
		if h, ok := lapRoutes["/"+tail]; ok {
			s.serveLAP(w, r, "/"+tail, h)
			return
		}
	}
	if tail, ok := strings.CutPrefix(path, s.cfg.Prefix); ok {
		if m, ok := metaRoutes[tail]; ok {
			s.observeMeta(w, r, path, tail, m)
			return
		}
	}
	writeError(w, errf(http.StatusNotFound, CodeNotFound, "no route "+path))
}

// observeMeta serves a meta route with a request id, timed for the
// Observer.
func (s *Server) observeMeta(w http.ResponseWriter, r *http.Request, path, route string, m metaHandler) {
	start := time.Now()
	ctx, rid := requestID(r)
	w.Header().Set(HeaderRequestID, rid)
	r = r.WithContext(ctx)
	sw := statusWriters.Get().(*statusWriter)
	sw.ResponseWriter, sw.status = w, 0
	s.serveMeta(sw, r, path, m)
	status := sw.status
	sw.ResponseWriter = nil
	statusWriters.Put(sw)
	if status == 0 {
		status = http.StatusOK
	}
	if s.cfg.Observer != nil {
		s.cfg.Observer.Call("meta", route, status, time.Since(start), rid)
	}
	s.logCall(ctx, "meta", route, status, start, rid)
}

// enter counts an in-flight call; false while draining.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.inflight++
	return true
}

func (s *Server) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	if s.draining && s.inflight == 0 {
		close(s.idle)
	}
}

// Drain makes every new meta and LAP call answer 503 shutting-down (with
// Retry-After) while the calls in flight finish. It cannot be undone.
func (s *Server) Drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return
	}
	s.draining = true
	s.drainCancel()
	if s.inflight == 0 {
		close(s.idle)
	}
}

// pollContext is ctx bounded by d and ended by Drain: for the long polls
// (/wait, approvals), which then answer as if their time were up.
func (s *Server) pollContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, d)
	stop := context.AfterFunc(s.drainCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// Draining reports whether Drain was called.
func (s *Server) Draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// WaitIdle waits, after Drain, until no call is in flight, or for ctx.
func (s *Server) WaitIdle(ctx context.Context) error {
	if !s.Draining() {
		return errors.New("lap: WaitIdle before Drain")
	}
	select {
	case <-s.idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errShuttingDown = &apiError{status: http.StatusServiceUnavailable, code: CodeShuttingDown,
	detail: "lapd is restarting; retry in a few seconds", retryAfterS: 5}

func (s *Server) audit(ctx context.Context, tid, uid, event string, detail map[string]any) {
	s.cfg.Audit.Record(context.WithoutCancel(ctx), audit.Entry{TID: tid, UID: uid, Event: event, Detail: detail})
}

// auditRefusal records a gate refusal under the matching event, within the
// client IP's audit budget (audit.Log.RecordLimited: a flood of refusals
// becomes one counted entry per interval).
func (s *Server) auditRefusal(ctx context.Context, r *http.Request, tid, endpoint string, e *apiError) {
	ev := audit.EventRefused
	switch e.code {
	case CodeAuthFailed, CodeAuthRequired:
		ev = audit.EventAuthFailed
	case CodeRateLimited:
		ev = audit.EventRateLimited
	}
	d := map[string]any{"endpoint": endpoint, "status": e.status, "code": e.code}
	if e.reconnect != "" {
		d["reconnect"] = e.reconnect
	}
	d["client"] = clientIP(r, s.cfg.TrustProxy)
	s.cfg.Audit.RecordLimited(context.WithoutCancel(ctx), "ip:"+clientip.KeyOf(r, s.cfg.TrustProxy), audit.Entry{TID: tid, Event: ev, Detail: d})
}

// Stats are the Server's gauges and counters of kept data (for metrics).
type Stats struct {
	IdemKeys        int   // idempotency keys remembered now
	IdemBytes       int   // bytes of remembered /message bodies (and keys)
	IdemShed        int64 // bodies dropped early for the byte budget, since New
	Policies        int   // compiled hello.policy kept now
	PolicyBytes     int   // their estimated bytes
	PoliciesEvicted int64 // compiled policies evicted for the byte budget, since New
}

// Stats returns the Server's kept-data gauges and counters.
func (s *Server) Stats() Stats {
	var st Stats
	st.IdemKeys, st.IdemBytes, st.IdemShed = s.idem.stats()
	st.Policies, st.PolicyBytes, st.PoliciesEvicted = s.policies.stats()
	return st
}

// logShed logs that kept data was dropped for a byte budget, at most once
// every 10 s (the counters in Stats count every one). It may be called with
// the idempotency or policy cache lock held: it takes no other lock.
func (s *Server) logShed(what, tid string, n int) {
	s.shedLogMu.Lock()
	now := time.Now()
	if now.Sub(s.shedLogAt) < 10*time.Second {
		s.shedLogMu.Unlock()
		return
	}
	s.shedLogAt = now
	s.shedLogMu.Unlock()
	s.log.Warn("lap: kept "+what+" data over its byte budget; dropped the oldest of the heaviest session (see Stats)", "tid", tid, "bytes", n)
}

// logFailure logs a call answered 500 with its cause (a store that cannot
// write its data: disk full, read-only, corrupt), which the caller is not
// told: without it, mints and approvals failed with "internal" and the
// log said nothing. At most one line a second; the next says how many
// failed in between.
func (s *Server) logFailure(endpoint string, e *apiError) {
	if e.status != http.StatusInternalServerError {
		return
	}
	s.failLogMu.Lock()
	now := time.Now()
	if now.Sub(s.failLogAt) < time.Second {
		s.failUnlogd++
		s.failLogMu.Unlock()
		return
	}
	s.failLogAt = now
	n := s.failUnlogd
	s.failUnlogd = 0
	s.failLogMu.Unlock()
	args := []any{"endpoint", endpoint, "answered", e.detail}
	if e.cause != nil {
		args = append(args, "err", e.cause.Error())
	}
	if n > 0 {
		args = append(args, "also_failed_since_last_line", n)
	}
	s.log.Error("call failed on the server (500 internal); if the error names the database or the disk, check the data directory's free space and permissions", args...)
}
