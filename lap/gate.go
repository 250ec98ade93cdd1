package lap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/internal/jsonscan"
	"github.com/lapd-dev/lapd/pairing"
	"github.com/lapd-dev/lapd/tokens"
)

// call is one gated LAP request.
type call struct {
	s     *Server
	r     *http.Request
	ctx   context.Context
	route string
	rec   tokens.Record
	tid   string
	body  []byte         // nil when absent; may be invalid JSON (treated as null)
	audit map[string]any // lap-call detail on success
	// send: a /message, whose lap-call detail is {tool: send_message,
	// variant: sendVariant}, made only when the route audited no outcome
	// (an idempotent replay): most /message calls audit their outcome.
	send        bool
	sendVariant string
	// outcome: the route audited the call's outcome itself (msg-dispatched,
	// msg-blocked, confirm-proposed…), so finish writes no lap-call: one
	// entry per call.
	outcome bool
	// deferred: the gate left the admit to the route's first forwarded
	// call (pairing.Registry.DeferAdmit); lapCall settles it.
	deferred bool
	// gone (/message, /confirm-result) is cancelled when the tab's socket
	// closes after the gate: an approval wait then ends (tabGone).
	gone        context.Context
	goneRelease func()
}

// admitLater are the routes whose first forwarded operation may carry the
// gate's admit (paired? + the per-tid rate limit) in a cluster, saving a
// round trip: each does nothing before its first Call/CallReply that a call
// refused by the rate limit must not do (no idempotency key, no approval,
// no push, no audit outcome, no touch), so a refusal there is as if the
// gate had refused. /message and /would-dispatch settle the admit
// themselves (call.admitNow) before auditing a policy rejection, the one
// such effect they may have before their call (an idempotency key is
// dropped again when its call is refused). /narrate's one push carries it
// (Registry.PushLog). The other routes (/wait, /confirm-result,
// /recent-actions) ask the tab's node first, as on one node.
var admitLater = map[string]bool{
	"/describe": true, "/observe": true, "/state": true, "/query-state": true,
	"/actions": true, "/describe-visible": true, "/context": true, "/query-dom": true,
	"/message": true, "/would-dispatch": true, "/narrate": true,
}

// lapHandler answers a gated call: a value to write as JSON (json.RawMessage
// and []byte pass through) or an error.
type lapHandler func(c *call) (any, *apiError)

// writer is a lapHandler that writes the response itself (the hot path).
type writer interface {
	writeTo(w http.ResponseWriter)
}

// serveLAP serves one LAP call under its request id (the response's
// X-Request-Id, the audit entries' detail.rid, the rpc frame's rid) and
// tells the Observer how it ended.
func (s *Server) serveLAP(w http.ResponseWriter, r *http.Request, route string, h lapHandler) {
	ctx, rid := requestID(r)
	debug := s.log.Enabled(ctx, slog.LevelDebug)
	var start time.Time
	if s.cfg.Observer != nil || debug {
		start = time.Now()
	}
	w.Header().Set(HeaderRequestID, rid)
	status := s.lapCall(w, r, ctx, route, h)
	if s.cfg.Observer != nil {
		s.cfg.Observer.Call("lap", route, status, time.Since(start), rid)
	}
	if debug {
		s.logCall(ctx, "lap", route, status, start, rid)
	}
}

// lapCall runs the gate and the route and returns the status written.
func (s *Server) lapCall(w http.ResponseWriter, r *http.Request, ctx context.Context, route string, h lapHandler) int {
	if r.Method != http.MethodPost {
		// The reference answers GET with a null body; every LAP client
		// (its bridge included) POSTs.
		e := errf(http.StatusMethodNotAllowed, CodeMethodNotAllowed, "LAP routes take POST with a JSON body")
		w.Header().Set("Allow", http.MethodPost)
		s.auditRefusal(ctx, r, "", s.cfg.BasePath+route, e)
		writeError(w, e)
		return e.status
	}
	if !s.enter() {
		s.auditRefusal(ctx, r, "", s.cfg.BasePath+route, errShuttingDown)
		writeError(w, errShuttingDown)
		return errShuttingDown.status
	}
	defer s.leave()
	c := &call{s: s, r: r, ctx: ctx, route: route}
	defer c.releaseGone() // deferred: a route that panics must not keep its tid's entry
	res, e := c.gate(w)
	if e == nil {
		res, e = h(c)
	}
	if c.deferred {
		if se := c.settleAdmit(); se != nil {
			if r, ok := res.(interface{ release() }); ok {
				r.release()
			}
			res, e = nil, se
		}
	}
	if e != nil {
		s.auditRefusal(c.ctx, r, c.tid, s.cfg.BasePath+route, e)
		s.logFailure(s.cfg.BasePath+route, e)
		writeError(w, e)
		return e.status
	}
	c.finish()
	if wt, ok := res.(writer); ok {
		wt.writeTo(w)
		return http.StatusOK
	}
	writeJSON(w, res)
	return http.StatusOK
}

// releaseGone lets go of the call's hold on its tid's tabGone entry.
func (c *call) releaseGone() {
	if c.goneRelease != nil {
		c.goneRelease()
	}
}

// gate runs the reference's checks in order and reads the body.
func (c *call) gate(w http.ResponseWriter) (any, *apiError) {
	s := c.s
	// 1. declared size
	if c.r.ContentLength > s.cfg.MaxBody {
		return nil, s.lapTooLarge()
	}
	// 2. bearer
	token, ok := BearerToken(c.r.Header.Get("Authorization"))
	if !ok {
		return nil, errf(http.StatusUnauthorized, CodeAuthFailed, detailNoBearer)
	}
	rec, err := s.cfg.Tokens.Verify(c.ctx, token)
	switch {
	case errors.Is(err, tokens.ErrRevoked):
		c.tid = rec.TID
		return nil, errf(http.StatusForbidden, CodeRevoked, detailRevoked)
	case errors.Is(err, tokens.ErrMalformed), errors.Is(err, tokens.ErrUnknown), errors.Is(err, tokens.ErrExpired), errors.Is(err, tokens.ErrNotFound):
		return nil, &apiError{status: http.StatusUnauthorized, code: CodeAuthFailed, invalidToken: true, detail: detailBadToken}
	case err != nil:
		if c.ctx.Err() != nil {
			return nil, errf(http.StatusGatewayTimeout, CodeTimeout, "request cancelled")
		}
		c.s.log.Error("verifying a bearer failed", "err", err, "rid", audit.RequestID(c.ctx))
		return nil, storeErr(c.ctx, err, "token store unavailable")
	}
	c.tid = rec.TID
	// 3. re-read by tid
	rec, err = s.cfg.Tokens.Get(c.ctx, c.tid)
	if err != nil || rec.Status == tokens.StatusRevoked {
		return nil, errf(http.StatusForbidden, CodeRevoked, detailRevoked)
	}
	c.rec = rec
	if c.route == "/message" || c.route == "/confirm-result" {
		// Before the admit: a close after it ends the call's approval
		// wait, even one that comes before the wait starts.
		c.gone, c.goneRelease = s.tabGone.hold(c.tid)
	}
	// 4. paired? 5. rate limit per tid: both decided where the tab lives
	// (Hooks.OnAdmit; on another node in a cluster, where the route's first
	// forwarded call may carry them: admitLater).
	if admitLater[c.route] {
		if ctx, ok := s.cfg.Registry.DeferAdmit(c.ctx, c.tid); ok {
			c.ctx, c.deferred = ctx, true
			return nil, c.readRequestBody()
		}
	}
	paired, retryMs, err := s.cfg.Registry.Admit(c.ctx, c.tid)
	if err != nil && c.ctx.Err() != nil {
		return nil, errf(http.StatusGatewayTimeout, CodeTimeout, "request cancelled")
	}
	if err != nil {
		c.s.log.Warn("asking the tab's node failed", "tid", c.tid, "err", err)
	}
	if !paired && err != nil {
		return nil, s.pausedNoAnswer(c.ctx, c.tid)
	}
	if !paired {
		return nil, s.paused(c.ctx, c.tid)
	}
	if retryMs > 0 {
		return nil, s.rateLimited(retryMs)
	}
	// 6. the body
	if e := c.readRequestBody(); e != nil {
		return nil, e
	}
	// 7. touch on arrival for long polls
	if c.route == "/wait" || c.route == "/confirm-result" {
		_ = s.cfg.Tokens.Touch(c.ctx, c.tid)
	}
	return nil, nil
}

// admitNow settles a deferred admit before a route's first effect that a
// refused call must not have (an outcome audited): the route's call then
// makes no admit of its own. Without a
// deferred admit (one node, or the gate asked first) it does nothing.
func (c *call) admitNow() *apiError {
	if !c.deferred {
		return nil
	}
	return c.settleAdmit()
}

// settleAdmit runs a deferred admit that no forwarded call carried (the
// route found what it needed in this node's cache, or failed before its
// call): a refusal or "not paired" replaces the route's answer, as if the
// gate had answered.
func (c *call) settleAdmit() *apiError {
	paired, retryMs, err := c.s.cfg.Registry.SettleAdmit(c.ctx, c.tid)
	if err != nil {
		if c.ctx.Err() == nil {
			c.s.log.Warn("asking the tab's node failed", "tid", c.tid, "err", err)
		}
		return nil
	}
	if !paired {
		return c.s.paused(c.ctx, c.tid)
	}
	if retryMs > 0 {
		return c.s.rateLimited(retryMs)
	}
	return nil
}

// rateLimited is the 429 of a call the tab's per-tid rate limit refused.
func (s *Server) rateLimited(retryMs int64) *apiError {
	return &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited, retryAfter: retryMs,
		detail: "too many calls: " + s.lapRateText + "; wait " + strconv.FormatInt(retrySeconds(retryMs), 10) + " s (Retry-After) before the next call"}
}

// lapTooLarge is the 413 of a LAP body over MaxBody.
func (s *Server) lapTooLarge() *apiError {
	return errf(http.StatusRequestEntityTooLarge, CodePayloadTooLarge, "the request body is over lapd's "+sizeText(s.cfg.MaxBody)+
		" limit for a LAP call; send a smaller body (a smaller payload, or a batch split into several calls)")
}

// readRequestBody is the gate's step 6: the body through a limit (covers
// chunked bodies), valid UTF-8 and JSON.
func (c *call) readRequestBody() *apiError {
	s := c.s
	if c.r.Body != nil && c.r.Body != http.NoBody {
		b, err := readBody(c.r.Body, c.r.ContentLength, s.cfg.MaxBody)
		if err != nil {
			return bodyReadError(err)
		}
		if int64(len(b)) > s.cfg.MaxBody {
			return s.lapTooLarge()
		}
		// Parts of the body are forwarded to the tab byte for byte in a
		// WebSocket text frame, which must be UTF-8 (a browser fails the
		// socket otherwise, and the tab reconnect-loops).
		if !utf8.Valid(b) {
			return errf(http.StatusBadRequest, CodeInvalid, "the body is not valid UTF-8; send JSON encoded as UTF-8")
		}
		if e := checkJSON(b); e != nil {
			return e
		}
		c.body = b
	}
	return nil
}

// finish: activation (awaiting-claude → active + {t:'active'}; or a
// re-paired tab's first model call, see Manager.Activate), touch, audit.
func (c *call) finish() {
	ctx := context.WithoutCancel(c.ctx)
	if c.rec.Status == tokens.StatusAwaitingClaude || (c.rec.Status == tokens.StatusActive && !c.rec.Used) {
		if _, changed, err := c.s.cfg.Tokens.Activate(ctx, c.tid); err == nil && changed {
			_ = c.s.cfg.Registry.Push(c.tid, activeFrame)
		}
	}
	_ = c.s.cfg.Tokens.Touch(ctx, c.tid)
	if c.outcome {
		return // the route's outcome entry (msg-dispatched, …) is this call's entry
	}
	d := c.audit
	if d == nil && c.send {
		d = map[string]any{"tool": "send_message", "variant": c.sendVariant}
	}
	if d == nil {
		d = map[string]any{"path": c.s.cfg.BasePath + c.route}
	}
	c.s.audit(ctx, c.tid, c.rec.UID, audit.EventLapCall, d)
}

// auditOutcome records what the call did (msg-dispatched, msg-blocked,
// confirm-*) as the call's audit entry, in place of the lap-call.
func (c *call) auditOutcome(event string, detail map[string]any) {
	c.outcome = true
	c.s.audit(c.ctx, c.tid, c.rec.UID, event, detail)
}

var activeFrame = json.RawMessage(`{"t":"active"}`)

// repairedFrame is what a tab that re-pairs before any model used its token
// is pushed: the reference's {t:'active'} (a re-pair is active), with
// lapd's "model":false saying no model has used the session yet. lapd.js
// then keeps asking the human to paste the connect line; the model's first
// call pushes activeFrame.
var repairedFrame = json.RawMessage(`{"t":"active","model":false}`)

// readBody reads r to its end, or to limit+1 bytes (a body over the limit),
// as io.ReadAll(io.LimitReader(r, limit+1)) does, into a buffer of the
// declared size when there is one (one allocation, not a LimitReader and a
// growing buffer).
func readBody(r io.Reader, declared, limit int64) ([]byte, error) {
	size := int64(512)
	if declared >= 0 && declared <= limit {
		size = declared + 1 // room to read the EOF without growing
	}
	b := make([]byte, 0, size)
	lr := io.LimitedReader{R: r, N: limit + 1}
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// BearerToken returns the credentials of an "Authorization: Bearer <token>"
// header value; the scheme is matched case-insensitively (RFC 7235).
func BearerToken(h string) (string, bool) {
	if len(h) < 7 || !strings.EqualFold(h[:7], "bearer ") {
		return "", false
	}
	t := strings.TrimSpace(h[7:])
	return t, t != ""
}

// checkJSON refuses a body that is not valid JSON (400 invalid). An empty
// body passes: every route's fields are optional or checked by the route.
func checkJSON(b []byte) *apiError {
	if t := trimSpace(b); len(t) > 0 && !jsonscan.Valid(t) { // json.Valid's answer, in one faster pass
		return errf(http.StatusBadRequest, CodeInvalid, "the body is not valid JSON; send a JSON object such as {}")
	}
	return nil
}

// decode unmarshals the body into v; an absent body, or a valid one that is
// not a JSON object, leaves v zero (the reference reads it as null). Invalid
// JSON never gets here (the gate answers 400).
func (c *call) decode(v any) {
	if len(c.body) == 0 {
		return
	}
	b := trimSpace(c.body)
	if len(b) == 0 || b[0] != '{' {
		return
	}
	if err := json.Unmarshal(b, v); err != nil {
		// a type mismatch inside a valid object still fills what it can;
		// invalid JSON is null.
		if !json.Valid(b) {
			zero(v)
		}
	}
}

func zero(v any) {
	// re-decode null resets nothing; callers pass pointers to fresh zero structs,
	// so a partial fill from invalid JSON is cleared by decoding an empty object.
	_ = json.Unmarshal([]byte(`{}`), v)
}

func trimSpace(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == '\n' || b[j-1] == '\r' || b[j-1] == '\t') {
		j--
	}
	return b[i:j]
}

// Details of the refusals a model most often meets. A reference bridge shows
// the model only code and detail (not X-LLui-Reconnect or Retry-After), so
// each says what to do and when, in one sentence.
const (
	askNewLine      = `ask the user for a new connect line from the app's "Connect an AI" panel and call connect_session with it`
	detailRevoked   = "the user revoked this session in the app; " + askNewLine + " if they want to continue"
	detailExpired   = "the app tab did not come back within the grace window, so this session expired; " + askNewLine
	detailGone      = "this session no longer exists; " + askNewLine
	detailNotPaired = "the app tab is not connected (it was never opened with this token, or it is closed); retry in %d s, and if it keeps failing ask the user to open the app tab and keep it open"
	detailResuming  = "the app tab disconnected (a reload or a network drop) and may reconnect within %d s; retry in a few seconds, and if it keeps failing ask the user to reopen the app tab"
	detailNoAnswer  = "the lapd node that holds the app tab did not answer (it is restarting, or cut off from this one); the tab reconnects to a live node by itself: retry in %d s, and if it keeps failing ask the user to reload the app tab"
	detailNoHello   = "the app tab is connected but has not introduced itself yet (its hello has not arrived); retry in %d s"
	detailSkew      = "the app tab was refused because its lapd client is too old (it speaks a LAP version below 2), so retrying will not help: ask the user to update the app's lapd client (client/lapd.js) and reload the app tab, then, if this session has expired meanwhile, " + askNewLine
	detailBadToken  = "the token is unknown or expired (or was replaced by a resume/claim, which hands out a new one); " + askNewLine
	detailNoBearer  = "the Authorization header is missing or does not use the Bearer scheme: send Authorization: Bearer <token>, with the token from the connect line"
	// A /message whose tab did not answer may have acted: observe first.
	detailMessageTimeout = "the app tab did not answer in time, and the action may have run: call observe to see whether it took effect before sending it again (a retry with the same idempotencyKey is never dispatched twice)"
	detailTimeout        = "the app tab did not answer in time (it may be busy, or its page frozen); retry, and if it keeps failing ask the user to reload the app tab"
)

// noHello is the 503 paused of a route that needs the tab's cached hello
// (/describe, /observe) when there is none: a tab that is connected has
// not sent it yet (it comes right after the socket opens), one that is not
// gets the usual paused.
func (c *call) noHello() *apiError {
	if c.s.cfg.Registry.Health(c.tid).Connected {
		return c.s.pausedAsWait(c.ctx, c.tid, detailNoHello, 1)
	}
	return c.s.paused(c.ctx, c.tid)
}

// pausedNoAnswer is paused for a call whose admit the tab's node did not
// answer, or whose connection to that node was lost (a cluster node
// restarting, stopped, or cut off): for a tab the
// record says is connected, the detail says that node did not answer
// rather than "not connected", which would have the model ask the user to
// open a tab that is open.
func (s *Server) pausedNoAnswer(ctx context.Context, tid string) *apiError {
	return s.pausedAs(ctx, tid, detailNoAnswer)
}

// paused builds the 503 paused response from tid's record.
func (s *Server) paused(ctx context.Context, tid string) *apiError {
	return s.pausedAs(ctx, tid, detailNotPaired)
}

// pausedAs is paused with notPaired (a format of one %d, the seconds to
// wait) as the detail for a record that is not resuming, revoked or gone.
func (s *Server) pausedAs(ctx context.Context, tid, notPaired string) *apiError {
	return s.pausedAsWait(ctx, tid, notPaired, 5)
}

// pausedAsWait is pausedAs with wait seconds (Retry-After) for a record
// that is not resuming, revoked or gone. A session whose tab lapd refused
// for its LAP version says so whatever the record: a retry never helps.
func (s *Server) pausedAsWait(ctx context.Context, tid, notPaired string, wait int) *apiError {
	e := &apiError{status: http.StatusServiceUnavailable, code: CodePaused}
	defer func() {
		if (e.reconnect == "pending" || e.reconnect == "expired") && s.skew.has(tid) {
			e.detail = detailSkew
		}
	}()
	rec, err := s.cfg.Tokens.Get(context.WithoutCancel(ctx), tid)
	switch {
	case err != nil:
		e.reconnect, e.detail = "unknown", detailGone
	case rec.Status == tokens.StatusRevoked:
		e.reconnect, e.detail = "revoked", detailRevoked
	case rec.Status == tokens.StatusPendingResume:
		now := s.cfg.Tokens.Now()
		if rec.PendingResumeUntil > now {
			e.reconnect = "pending"
			e.retryAfterS = int((rec.PendingResumeUntil - now + 999) / 1000)
			if e.retryAfterS < 1 {
				e.retryAfterS = 1
			}
			e.detail = fmt.Sprintf(detailResuming, e.retryAfterS)
		} else {
			e.reconnect, e.detail = "expired", detailExpired
		}
	default:
		e.reconnect = "pending"
		e.retryAfterS = wait
		e.detail = fmt.Sprintf(notPaired, e.retryAfterS)
	}
	return e
}

// rpc calls tool on the tab (timeout 0 = the registry's default) and maps a
// failure to the wire.
func (c *call) rpc(tool string, args any, timeout time.Duration) (json.RawMessage, *apiError) {
	start := c.rpcStart()
	res, err := c.s.cfg.Registry.Call(c.ctx, c.tid, tool, args, timeout)
	c.rpcDone(tool, start, err)
	if err != nil {
		return nil, c.rpcErr(err)
	}
	return res, nil
}

// rpcStart and rpcDone time an RPC for the Observer (no clock read
// without one).
func (c *call) rpcStart() time.Time {
	if c.s.cfg.Observer == nil {
		return time.Time{}
	}
	return time.Now()
}

func (c *call) rpcDone(tool string, start time.Time, err error) {
	if _, ok := err.(*pairing.RateLimitError); ok {
		return // refused by the gate's deferred admit: no rpc was made
	}
	if obs := c.s.cfg.Observer; obs != nil {
		obs.RPC(tool, time.Since(start), err)
	}
}

// rpcErr maps a Registry error to the wire; an error after the frame was
// sent is marked in doubt (for idempotency).
func (c *call) rpcErr(err error) *apiError {
	ae := c.mapRPCErr(err)
	if errors.Is(err, pairing.ErrOutcomeUnknown) {
		cp := *ae
		cp.inDoubt = true
		ae = &cp
	}
	return ae
}

func (c *call) mapRPCErr(err error) *apiError {
	var re *pairing.RPCError
	var rl *pairing.RateLimitError
	switch {
	case errors.As(err, &rl): // a deferred admit refused on the tab's node: the gate's 429
		return c.s.rateLimited(rl.RetryAfterMs)
	case errors.Is(err, pairing.ErrPaused) && errors.Is(err, pairing.ErrLinkLost):
		return c.s.pausedNoAnswer(c.ctx, c.tid)
	case errors.Is(err, pairing.ErrPaused):
		return c.s.paused(c.ctx, c.tid)
	case errors.Is(err, pairing.ErrTimeout):
		if c.route == "/message" {
			return errf(http.StatusGatewayTimeout, CodeTimeout, detailMessageTimeout)
		}
		return errf(http.StatusGatewayTimeout, CodeTimeout, detailTimeout)
	case errors.Is(err, pairing.ErrClosed):
		return errShuttingDown
	case errors.As(err, &re):
		code := re.Code
		if code == "" {
			code = CodeInternal
		}
		if code == CodeOutcomeUnknown { // the tab de-duplicated an idempotencyKey it has no result for
			return errf(http.StatusConflict, code, re.Detail)
		}
		return errf(http.StatusInternalServerError, code, re.Detail)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return errf(http.StatusGatewayTimeout, CodeTimeout, "request cancelled")
	}
	return errf(http.StatusInternalServerError, CodeInternal, err.Error())
}
