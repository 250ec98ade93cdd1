package lap

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/clientip"
	"github.com/lapd-dev/lapd/pairing"
	"github.com/lapd-dev/lapd/tokens"
)

// MaxMetaBody caps a meta route's body; MaxResumeTIDs caps resume/list's tids.
const (
	MaxMetaBody   = 64 << 10
	MaxResumeTIDs = 100
)

type metaHandler struct {
	method string
	fn     func(s *Server, m *metaCall) (any, *apiError)
}

type metaCall struct {
	r      *http.Request
	ctx    context.Context
	uid    string
	origin string // the request URL's origin (scheme://host): lapd's own, for the URLs handed out
	// page is the origin of the page that calls (the browser's Origin
	// header, which corsHeaders has allowed; the request's origin when
	// there is none). A session is bound to it: only a page of the same
	// origin may claim it.
	page string
	body []byte
}

var metaRoutes = map[string]metaHandler{
	"/mint":         {http.MethodPost, (*Server).mint},
	"/resume/list":  {http.MethodPost, (*Server).resumeList},
	"/resume/claim": {http.MethodPost, (*Server).resumeClaim},
	"/revoke":       {http.MethodPost, (*Server).revoke},
	"/sessions":     {http.MethodGet, (*Server).sessions},
}

func (s *Server) serveMeta(w http.ResponseWriter, r *http.Request, path string, h metaHandler) {
	if !s.corsHeaders(w, r, h.method) {
		// Naming lapd's own origin shows the usual mistake at once: a page
		// opened on a node's own address while lapd answers as --public-url.
		e := errf(http.StatusForbidden, CodeForbiddenOrigin, "Origin "+strconv.Quote(r.Header.Get("Origin"))+" may not call "+path+
			": only lapd's own origin, "+strconv.Quote(s.requestOrigin(r))+", and the origins it is configured with are allowed (lapd serve --origins, or Config.Origins for an embedded lapd); add the app's origin there, or open the app at lapd's own origin")
		s.auditRefusal(r.Context(), r, "", path, e)
		writeError(w, e)
		return
	}
	if r.Method == http.MethodOptions {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if !s.enter() {
		s.auditRefusal(r.Context(), r, "", path, errShuttingDown)
		writeError(w, errShuttingDown)
		return
	}
	defer s.leave()
	if r.Method != h.method {
		e := errf(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "use "+h.method)
		w.Header().Set("Allow", h.method)
		s.auditRefusal(r.Context(), r, "", path, e)
		writeError(w, e)
		return
	}
	m := &metaCall{r: r, ctx: r.Context(), origin: s.requestOrigin(r)}
	m.page = m.origin
	if o := strings.TrimRight(r.Header.Get("Origin"), "/"); o != "" {
		m.page = o
	}
	if s.cfg.Identity != nil {
		uid, err := s.cfg.Identity.Resolve(r)
		if err != nil {
			s.log.Debug("identity not resolved", "path", path, "err", err)
			uid = ""
		}
		m.uid = uid
	}
	if r.Body != nil && r.Body != http.NoBody {
		if r.ContentLength > MaxMetaBody {
			e := errMetaTooLarge
			s.auditRefusal(m.ctx, m.r, "", path, e)
			writeError(w, e)
			return
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, MaxMetaBody+1))
		if err != nil || len(b) > MaxMetaBody {
			e := errMetaTooLarge
			if err != nil {
				e = bodyReadError(err)
			}
			s.auditRefusal(m.ctx, m.r, "", path, e)
			writeError(w, e)
			return
		}
		if e := checkJSON(b); e != nil {
			writeError(w, e)
			return
		}
		m.body = b
	}
	res, e := h.fn(s, m)
	if e != nil {
		if e.status != http.StatusBadRequest {
			s.auditRefusal(m.ctx, m.r, "", path, e)
		}
		s.logFailure(path, e)
		writeError(w, e)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, res)
}

var errMetaTooLarge = errf(http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
	"the request body is over the 64 KiB limit of lapd's meta routes; send a smaller body (resume/list reads at most 100 tids)")

// mintLimited is the 429 of a mint or resume/claim over the mint rate.
func (s *Server) mintLimited(ms int64) *apiError {
	return &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited, retryAfter: ms,
		detail: "too many mints: lapd allows " + s.mintRateText + "; wait " + strconv.FormatInt(retrySeconds(ms), 10) + " s (Retry-After) and try again"}
}

// requestOrigin is scheme://host of the request URL; X-Forwarded-Proto/Host
// only count with TrustProxy > 0.
func (s *Server) requestOrigin(r *http.Request) string {
	if s.cfg.PublicURL != "" {
		return s.cfg.PublicURL
	}
	scheme, host := "http", r.Host
	if r.TLS != nil {
		scheme = "https"
	}
	if s.cfg.TrustProxy > 0 {
		if p := firstValue(r.Header.Get("X-Forwarded-Proto")); p == "http" || p == "https" {
			scheme = p
		}
		if h := firstValue(r.Header.Get("X-Forwarded-Host")); h != "" {
			host = h
		}
	}
	return scheme + "://" + host
}

func firstValue(v string) string {
	v, _, _ = strings.Cut(v, ",")
	return strings.TrimSpace(v)
}

func (s *Server) urls(origin string) (wsURL, lapURL string) {
	ws := "ws" + strings.TrimPrefix(origin, "http")
	return ws + s.cfg.Prefix + "/ws", origin + s.cfg.BasePath
}

func (s *Server) rateKey(m *metaCall) string {
	if m.uid != "" {
		return "uid:" + m.uid
	}
	// IPv6 callers are counted per /64: one subscriber holds a whole /64.
	return "ip:" + clientip.KeyOf(m.r, s.cfg.TrustProxy)
}

func (s *Server) mint(m *metaCall) (any, *apiError) {
	if m.uid == "" && !s.cfg.AllowAnonymous {
		return nil, errf(http.StatusUnauthorized, CodeAuthRequired, "sign in to the app first (anonymous mint is disabled)")
	}
	var b struct {
		Tab bool `json:"tab"` // lapd's addition: also mint a tab secret
	}
	_ = json.Unmarshal(m.body, &b)
	if ok, ms := s.mintRate.allow(s.rateKey(m)); !ok {
		return nil, s.mintLimited(ms)
	}
	var token, tab string
	var rec tokens.Record
	var err error
	if b.Tab {
		token, tab, rec, err = s.cfg.Tokens.MintTab(m.ctx, m.uid, m.page, "")
	} else {
		token, rec, err = s.cfg.Tokens.Mint(m.ctx, m.uid, m.page, "")
	}
	if err != nil {
		return nil, storeErr(m.ctx, err, "mint failed")
	}
	s.audit(m.ctx, rec.TID, m.uid, audit.EventMint, map[string]any{"origin": m.page, "tabSecret": b.Tab})
	ws, lapURL := s.urls(m.origin)
	res := map[string]any{"token": token, "tid": rec.TID, "wsUrl": ws, "lapUrl": lapURL, "expiresAt": rec.ExpiresAt, "lapVersion": pairing.LapVersion}
	if tab != "" {
		res["tabSecret"] = tab
	}
	return res, nil
}

// AgentSession is the wire shape of a session in resume/list and sessions.
type AgentSession struct {
	TID        string  `json:"tid"`
	Label      *string `json:"label"`
	Status     string  `json:"status"`
	CreatedAt  int64   `json:"createdAt"`
	LastSeenAt int64   `json:"lastSeenAt"`
}

func sessionsOf(recs []tokens.Record) []AgentSession {
	out := make([]AgentSession, 0, len(recs))
	for _, r := range recs {
		a := AgentSession{TID: r.TID, Status: string(r.Status), CreatedAt: r.CreatedAt, LastSeenAt: r.LastSeenAt}
		if r.Label != "" {
			l := r.Label
			a.Label = &l
		}
		out = append(out, a)
	}
	return out
}

func (s *Server) resumeList(m *metaCall) (any, *apiError) {
	var b struct {
		TIDs json.RawMessage `json:"tids"`
	}
	_ = json.Unmarshal(m.body, &b)
	var tids []string
	if json.Unmarshal(b.TIDs, &tids) != nil || tids == nil {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "tids must be an array of strings")
	}
	if len(tids) > MaxResumeTIDs {
		tids = tids[:MaxResumeTIDs]
	}
	recs, err := s.cfg.Tokens.ResumeList(m.ctx, m.uid, tids)
	if err != nil {
		return nil, storeErr(m.ctx, err, "resume list failed")
	}
	return map[string]any{"sessions": sessionsOf(recs)}, nil
}

func tidOf(body []byte) (string, bool) {
	var b struct {
		TID json.RawMessage `json:"tid"`
	}
	_ = json.Unmarshal(body, &b)
	tid, ok := optString(b.TID)
	return tid, ok && tid != ""
}

// ownerOf is who a claim or revoke comes from: the identity's uid plus the
// proof the body carries (tabSecret, or token), which an anonymous session
// needs (tokens.Owner).
func ownerOf(m *metaCall) tokens.Owner {
	var b struct {
		TabSecret json.RawMessage `json:"tabSecret"`
		Token     json.RawMessage `json:"token"`
	}
	_ = json.Unmarshal(m.body, &b)
	tab, _ := optString(b.TabSecret)
	tok, _ := optString(b.Token)
	return tokens.Owner{UID: m.uid, TabSecret: tab, Token: tok}
}

func (s *Server) resumeClaim(m *metaCall) (any, *apiError) {
	tid, ok := tidOf(m.body)
	if !ok {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "tid required")
	}
	if ok, ms := s.mintRate.allow(s.rateKey(m)); !ok {
		return nil, s.mintLimited(ms)
	}
	token, tab, rec, err := s.cfg.Tokens.Claim(m.ctx, tid, m.page, ownerOf(m))
	if err != nil {
		if errors.Is(err, tokens.ErrForbidden) || errors.Is(err, tokens.ErrNotFound) || errors.Is(err, tokens.ErrExpired) || errors.Is(err, tokens.ErrRevoked) {
			// The same answer whether the tid is unknown, expired or someone
			// else's: a caller learns nothing about other users' sessions.
			detail := "this session cannot be claimed: only the signed-in user who minted it may claim it, from the page that minted it, inside its grace window; mint a new session instead"
			if m.uid == "" {
				detail = "an anonymous session is claimed with its tabSecret (or, minted without one, its token), from the page that minted it, inside its grace window"
			}
			return nil, errf(http.StatusForbidden, CodeRevoked, detail)
		}
		return nil, storeErr(m.ctx, err, "claim failed")
	}
	s.idem.drop(tid)
	s.audit(m.ctx, tid, m.uid, audit.EventClaim, map[string]any{"origin": m.page})
	ws, lapURL := s.urls(m.origin)
	res := map[string]any{"token": token, "tid": rec.TID, "wsUrl": ws, "lapUrl": lapURL, "expiresAt": rec.ExpiresAt}
	if tab != "" {
		res["tabSecret"] = tab
	}
	return res, nil
}

func (s *Server) revoke(m *metaCall) (any, *apiError) {
	tid, ok := tidOf(m.body)
	if !ok {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "tid required")
	}
	by := ownerOf(m)
	if err := s.revokeAs(m.ctx, tid, func() (tokens.Record, error) { return s.cfg.Tokens.Revoke(m.ctx, tid, by) }); err != nil {
		if errors.Is(err, tokens.ErrForbidden) || errors.Is(err, tokens.ErrNotFound) {
			// Unknown and someone else's answer alike, so a tid's existence
			// is not revealed. (The reference answers 403 revoked, which
			// reads like success although nothing was revoked.)
			return nil, errf(http.StatusNotFound, CodeNotFound, "no session "+quoteTID(tid)+" that you may revoke: nothing was revoked; pass the tid from the mint response (GET /agent/sessions lists yours), and for an anonymous session its tabSecret (or, minted without one, its token)")
		}
		return nil, storeErr(m.ctx, err, "revoke failed")
	}
	return map[string]string{"status": "revoked"}, nil
}

// Revoke ends session tid on the server's side, whoever owns it (an admin
// action of the host app): the token stops working at once (403 revoked), the
// tab is closed with 4001, its pending approvals are dropped, and the revoke
// is audited. tokens.ErrForbidden if tid is unknown; revoking twice is not an
// error.
func (s *Server) Revoke(ctx context.Context, tid string) error {
	return s.revokeAs(ctx, tid, func() (tokens.Record, error) { return s.cfg.Tokens.RevokeAny(ctx, tid) })
}

// revokeAs runs revoke (the token manager's, which checks who may) and then
// ends the session's live parts; the audit entry names the record's owner.
func (s *Server) revokeAs(ctx context.Context, tid string, revoke func() (tokens.Record, error)) error {
	rec, err := revoke()
	if err != nil {
		return err
	}
	uid := rec.UID
	s.cfg.Registry.Unregister(tid)
	s.onClosed(tid)
	s.cfg.Confirm.Drop(context.WithoutCancel(ctx), tid)
	s.idem.drop(tid)
	s.policies.drop(tid)
	s.descs.drop(tid)
	s.audit(ctx, tid, uid, audit.EventRevoke, map[string]any{})
	return nil
}

// quoteTID quotes a caller-supplied tid for an error detail, cut to 100 bytes.
func quoteTID(tid string) string {
	if len(tid) > 100 {
		tid = tid[:100] + "…"
	}
	return strconv.Quote(tid)
}

func (s *Server) sessions(m *metaCall) (any, *apiError) {
	if m.uid == "" {
		return map[string]any{"sessions": []AgentSession{}}, nil
	}
	recs, err := s.cfg.Tokens.Sessions(m.ctx, m.uid)
	if err != nil {
		return nil, storeErr(m.ctx, err, "sessions failed")
	}
	return map[string]any{"sessions": sessionsOf(recs)}, nil
}
