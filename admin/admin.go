// Package admin is lapd's operator console: one small page (HTML, CSS and
// one ES module, no build step, embedded in the binary like lapd.js) and the
// JSON API behind it, plus the access rules every operator route shares.
//
// The console shows the live sessions (app, identity, token state, tab
// connection and visibility, last heartbeat, calls, pending approvals) with
// a Revoke button, the audit trail with filters (tid, event, time) and
// paging, and a live chart of calls/s and errors/s read from the metrics.
// It works on a phone: tables turn into cards below 700 px.
//
// Most programs get it from lapd: (*lapd.Server).AdminHandler serves the
// console at /admin/ next to /metrics, /debug/pprof/, /healthz and /readyz,
// and `lapd serve --admin-addr` puts that handler on its own listener,
// never on the public one. By hand:
//
//	h, err := admin.New(admin.Config{Backend: b, Token: token, Audit: auditLog})
//	mux.Handle("/admin/", h)
//	mux.Handle("/metrics", h.Guard(metricsHandler))
//
// # Access
//
// With a Token, every API request must carry it (Authorization: Bearer),
// compared in constant time; the page asks for it once and keeps it in the
// tab's sessionStorage. Without one, only loopback clients are served, the
// Host header must name a loopback address (a DNS-rebinding page cannot
// reach the console through a name of its own), and a state-changing
// request must be same-origin JSON (a cross-site form cannot post it).
// Every refusal and every action (log-in, revoke) is audited; the token is
// never logged or audited.
package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/static"
)

// MinTokenLen is the shortest admin token accepted.
const MinTokenLen = 16

// Session is one row of the sessions view.
type Session struct {
	TID           string `json:"tid"`
	App           string `json:"app,omitempty"`
	AppVersion    string `json:"appVersion,omitempty"`
	UID           string `json:"uid,omitempty"`     // "" = anonymous
	Status        string `json:"status"`            // token state: awaiting-claude, active, pending-resume, revoked; "unknown" when the record is gone
	Connected     bool   `json:"connected"`         // a live WebSocket now
	Visible       *bool  `json:"visible,omitempty"` // nil = the tab never said
	LastHeartbeat int64  `json:"lastHeartbeatAt,omitempty"`
	ConnectedAt   int64  `json:"connectedAt,omitempty"`
	Reconnects    int    `json:"reconnects"`
	Calls         int64  `json:"calls"`   // RPCs sent to the tab
	Pending       int    `json:"pending"` // approvals waiting for the human
	Origin        string `json:"origin,omitempty"`
	Label         string `json:"label,omitempty"`
	CreatedAt     int64  `json:"createdAt,omitempty"`
	ExpiresAt     int64  `json:"expiresAt,omitempty"`
	LastSeenAt    int64  `json:"lastSeenAt,omitempty"`
}

// Overview is the console's header: totals and the counters its chart
// turns into rates.
type Overview struct {
	Version     string `json:"version"`
	StartedAt   int64  `json:"startedAt"` // ms
	Now         int64  `json:"now"`       // ms
	Tabs        int    `json:"tabs"`      // connected
	Held        int    `json:"held"`      // connected or inside the grace window
	Pending     int    `json:"pending"`
	MCPSessions int    `json:"mcpSessions"`
	Draining    bool   `json:"draining"`
	// Metrics is false when lapd runs without hot-path metrics; Calls and
	// Errors are then 0. Calls counts meta and LAP calls since start,
	// Errors those answered with a status ≥ 400.
	Metrics bool    `json:"metrics"`
	Calls   float64 `json:"calls"`
	Errors  float64 `json:"errors"`
	Audit   bool    `json:"audit"` // an audit trail can be queried
}

// ErrNoAudit is Backend.Audit's error when no audit sink can be read back.
var ErrNoAudit = errors.New("admin: no audit sink can be queried")

// ErrUnknownSession is Backend.Revoke's error for a tid lapd does not know.
var ErrUnknownSession = errors.New("admin: no such session")

// Backend is what the console shows and does. lapd.Server implements it
// over its parts. Methods are called concurrently.
type Backend interface {
	Overview(ctx context.Context) Overview
	// Sessions returns up to limit sessions (connected first) and how many
	// there are in all.
	Sessions(ctx context.Context, limit int) ([]Session, int, error)
	// Revoke ends session tid as the app's own revoke does (its token stops
	// working, its tab is told and closed); ErrUnknownSession if unknown.
	Revoke(ctx context.Context, tid string) error
	// Audit returns the entries f selects, oldest first; ErrNoAudit if none
	// can be read.
	Audit(ctx context.Context, f audit.Filter) ([]audit.Entry, error)
}

// Config configures the console.
type Config struct {
	Backend Backend // required
	// Token, when set (at least MinTokenLen characters), is required on
	// every guarded request; empty = loopback clients only.
	Token string
	// Audit records admin actions and refusals; nil = none.
	Audit  *audit.Log
	Now    func() time.Time // default time.Now
	Prefix string           // where the console lives; default "/admin"
}

// Handler serves the console under Config.Prefix. Safe for concurrent use.
type Handler struct {
	cfg    Config
	tokSum [32]byte
	files  http.Handler
	mux    *http.ServeMux
}

// Limits of the API.
const (
	MaxSessions  = 500 // rows of one sessions answer
	MaxAuditPage = 200 // entries of one audit page
	maxBody      = 4 << 10
)

//go:embed index.html
var indexHTML []byte

//go:embed admin.js
var adminJS []byte

//go:embed admin.css
var adminCSS []byte

// New checks cfg and returns the console's handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Backend == nil {
		return nil, errors.New("admin: Config.Backend is required")
	}
	if cfg.Token != "" && len(cfg.Token) < MinTokenLen {
		return nil, errors.New("admin: the admin token must be at least " + strconv.Itoa(MinTokenLen) + " characters (e.g. openssl rand -hex 24)")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/admin"
	}
	cfg.Prefix = "/" + strings.Trim(cfg.Prefix, "/")
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	if cfg.Token != "" {
		h.tokSum = sha256.Sum256([]byte(cfg.Token))
	}
	p := cfg.Prefix
	h.files = static.Handler(map[string]static.File{
		p + "/":          static.NewFile(indexHTML, "text/html; charset=utf-8"),
		p + "/admin.js":  static.NewFile(adminJS, "text/javascript; charset=utf-8"),
		p + "/admin.css": static.NewFile(adminCSS, "text/css; charset=utf-8"),
	})
	h.mux.Handle(p+"/api/", h.Guard(http.HandlerFunc(h.api)))
	h.mux.HandleFunc(p+"/", h.page)
	// Which log-in the page shows; it tells nothing else.
	h.mux.HandleFunc("GET "+p+"/mode", func(w http.ResponseWriter, r *http.Request) {
		if h.cfg.Token == "" && !loopbackHost(r.Host) {
			h.refuse(w, r, http.StatusForbidden, "forbidden-host", "the console without --admin-token answers only to a loopback Host (127.0.0.1, [::1], localhost)")
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, map[string]string{"mode": h.Mode()})
	})
	h.mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, p+"/", http.StatusMovedPermanently)
	})
	return h, nil
}

// Mode is "token" when a token guards the console, else "loopback".
func (h *Handler) Mode() string {
	if h.cfg.Token != "" {
		return "token"
	}
	return "loopback"
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// page serves the static files with a strict CSP. They hold no data: the
// page asks the API, which is guarded. Without a token, the Host rule
// applies to them too, so a rebinding page cannot load them either.
func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Token == "" && !loopbackHost(r.Host) {
		h.refuse(w, r, http.StatusForbidden, "forbidden-host", "the console without --admin-token answers only to a loopback Host (127.0.0.1, [::1], localhost)")
		return
	}
	setPageHeaders(w)
	h.files.ServeHTTP(w, r)
}

func setPageHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Content-Type-Options", "nosniff")
}

// Guard applies the console's access rules to next (the API, /metrics,
// pprof): a valid token when one is configured, else a loopback client
// with a loopback Host; a request that changes something must also be
// same-origin JSON. Refusals are JSON errors, audited.
func (h *Handler) Guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.cfg.Token != "" {
			tok, ok := bearer(r)
			sum := sha256.Sum256([]byte(tok))
			if !ok || subtle.ConstantTimeCompare(sum[:], h.tokSum[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="lapd admin"`)
				h.refuse(w, r, http.StatusUnauthorized, "bad-token", "send the admin token (--admin-token) as Authorization: Bearer <token>")
				return
			}
		} else {
			if !loopbackRemote(r.RemoteAddr) {
				h.refuse(w, r, http.StatusForbidden, "not-loopback", "without --admin-token the admin listener serves loopback clients only; set --admin-token to reach it from elsewhere")
				return
			}
			if !loopbackHost(r.Host) {
				h.refuse(w, r, http.StatusForbidden, "forbidden-host", "without --admin-token the admin listener answers only to a loopback Host (127.0.0.1, [::1], localhost)")
				return
			}
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r) {
				h.refuse(w, r, http.StatusForbidden, "forbidden-origin", "admin actions are accepted from the console's own origin only")
				return
			}
			if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				writeErr(w, http.StatusUnsupportedMediaType, "invalid", "send application/json")
				return
			}
		}
		w.Header().Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

func bearer(r *http.Request) (string, bool) {
	a := r.Header.Get("Authorization")
	if len(a) < 7 || !strings.EqualFold(a[:7], "bearer ") {
		return "", false
	}
	t := strings.TrimSpace(a[7:])
	return t, t != ""
}

func sameOrigin(origin string, r *http.Request) bool {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return strings.EqualFold(origin, scheme+"://"+r.Host)
}

// loopbackRemote reports whether the connection comes from a loopback address.
func loopbackRemote(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackHost reports whether a Host header names a loopback address.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// refuse writes a JSON error and audits the refusal (never the token).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, status int, code, detail string) {
	ev := audit.EventRefused
	if status == http.StatusUnauthorized {
		ev = audit.EventAuthFailed
	}
	ip := clientIP(r)
	e := audit.Entry{Event: ev, Detail: map[string]any{"endpoint": r.URL.Path, "status": status, "code": code, "ip": ip}}
	ctx := context.WithoutCancel(r.Context())
	// A flood of refusals costs a bounded number of audit writes per
	// client IP (summarised, never dropped silently).
	h.cfg.Audit.RecordLimited(ctx, "ip:"+ip, e)
	writeErr(w, status, code, detail)
}

func writeErr(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "detail": detail}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// record audits an admin action.
func (h *Handler) record(r *http.Request, tid string, detail map[string]any) {
	detail["ip"] = clientIP(r)
	h.cfg.Audit.Record(context.WithoutCancel(r.Context()), audit.Entry{TID: tid, Event: audit.EventAdmin, Detail: detail})
}

// api serves /admin/api/* (already guarded).
func (h *Handler) api(w http.ResponseWriter, r *http.Request) {
	route := strings.TrimPrefix(r.URL.Path, h.cfg.Prefix+"/api")
	method := map[string]string{"/login": http.MethodPost, "/overview": http.MethodGet, "/sessions": http.MethodGet,
		"/revoke": http.MethodPost, "/audit": http.MethodGet, "/events": http.MethodGet}[route]
	if method == "" {
		writeErr(w, http.StatusNotFound, "not-found", "no admin API route "+route)
		return
	}
	if r.Method != method {
		w.Header().Set("Allow", method)
		writeErr(w, http.StatusMethodNotAllowed, "method-not-allowed", "use "+method)
		return
	}
	ctx := r.Context()
	switch route {
	case "/login":
		// The guard checked the token (or the loopback rule); a log-in is
		// the operator opening the console, audited once per page load.
		h.record(r, "", map[string]any{"action": "login", "mode": h.Mode()})
		writeJSON(w, map[string]any{"ok": true, "mode": h.Mode()})
	case "/overview":
		writeJSON(w, h.cfg.Backend.Overview(ctx))
	case "/events":
		writeJSON(w, map[string]any{"events": audit.Events()})
	case "/sessions":
		limit := intParam(r, "limit", 200, 1, MaxSessions)
		ss, total, err := h.cfg.Backend.Sessions(ctx, limit)
		if err != nil {
			writeErr(w, http.StatusInternalServerError, "internal", "listing sessions failed: "+err.Error())
			return
		}
		if ss == nil {
			ss = []Session{}
		}
		writeJSON(w, map[string]any{"sessions": ss, "total": total})
	case "/revoke":
		var body struct {
			TID string `json:"tid"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&body); err != nil || body.TID == "" || len(body.TID) > 100 {
			writeErr(w, http.StatusBadRequest, "invalid", `send {"tid": "<session id>"}`)
			return
		}
		err := h.cfg.Backend.Revoke(ctx, body.TID)
		switch {
		case errors.Is(err, ErrUnknownSession):
			writeErr(w, http.StatusNotFound, "not-found", "no session "+strconv.Quote(body.TID)+"; refresh the list")
			return
		case err != nil:
			writeErr(w, http.StatusInternalServerError, "internal", "revoke failed: "+err.Error())
			return
		}
		h.record(r, body.TID, map[string]any{"action": "revoke"})
		writeJSON(w, map[string]any{"ok": true})
	case "/audit":
		h.auditPage(w, r)
	}
}

// auditPage answers GET /admin/api/audit?tid=&event=&since=&until=&limit=&offset=
// (since/until in Unix ms): the page of entries, newest first, and whether
// older ones exist.
func (h *Handler) auditPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := audit.Filter{TID: q.Get("tid"), Since: int64Param(q.Get("since")), Until: int64Param(q.Get("until"))}
	if ev := q.Get("event"); ev != "" {
		known := false
		for _, e := range audit.Events() {
			known = known || e == ev
		}
		if !known {
			writeErr(w, http.StatusBadRequest, "invalid", "unknown event "+strconv.Quote(ev)+"; GET /admin/api/events lists them")
			return
		}
		f.Event = ev
	}
	if len(f.TID) > 100 {
		writeErr(w, http.StatusBadRequest, "invalid", "tid too long")
		return
	}
	limit := intParam(r, "limit", 50, 1, MaxAuditPage)
	f.Offset = intParam(r, "offset", 0, 0, 1_000_000)
	f.Limit = limit + 1 // one more tells whether an older page exists
	entries, err := h.cfg.Backend.Audit(r.Context(), f)
	switch {
	case errors.Is(err, ErrNoAudit):
		writeErr(w, http.StatusNotFound, "no-audit", "this lapd keeps no audit trail it can read back; run it with --audit sqlite (the default with --store sqlite) or file:PATH")
		return
	case err != nil:
		writeErr(w, http.StatusInternalServerError, "internal", "reading the audit failed: "+err.Error())
		return
	}
	more := len(entries) > limit
	if more {
		entries = entries[1:] // the oldest is the extra one
	}
	out := make([]audit.Entry, 0, len(entries))
	for i := len(entries) - 1; i >= 0; i-- {
		out = append(out, entries[i])
	}
	writeJSON(w, map[string]any{"entries": out, "more": more, "offset": f.Offset, "limit": limit})
}

func intParam(r *http.Request, name string, def, lo, hi int) int {
	v, err := strconv.Atoi(r.URL.Query().Get(name))
	if err != nil {
		return def
	}
	return min(max(v, lo), hi)
}

func int64Param(s string) int64 {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0
	}
	return v
}
