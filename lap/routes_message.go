package lap

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/internal/jsonscan"
	"github.com/lapd-dev/lapd/internal/storeerr"
	"github.com/lapd-dev/lapd/schema"
)

type messageBody struct {
	Msg            json.RawMessage `json:"msg"`
	Reason         json.RawMessage `json:"reason"`
	WaitFor        json.RawMessage `json:"waitFor"`
	DrainQuietMs   json.RawMessage `json:"drainQuietMs"`
	TimeoutMs      json.RawMessage `json:"timeoutMs"`
	IncludeState   json.RawMessage `json:"includeState"`
	IdempotencyKey json.RawMessage `json:"idempotencyKey"`
	// ApprovalTimeoutMs (lapd addition) is how long an action that needs
	// the user's approval waits for it; default timeoutMs, 0 = not at all.
	ApprovalTimeoutMs json.RawMessage `json:"approvalTimeoutMs"`
}

// splitMsg reads msg's variant and payload by exact key (schema.SplitMsg),
// with the tab's policy discriminant: the one decode audit, policy and
// stored approvals all use.
func (c *call) splitMsg(msg json.RawMessage) (splitMsg, *apiError) {
	pol, _ := c.s.policy(c.ctx, c.tid) // a policy error is reported by checkPolicy
	sm := splitMsg{msg: msg, disc: pol.Discriminant()}
	var err error
	sm.variant, sm.payload, err = schema.SplitMsg(msg, sm.disc)
	if err != nil {
		return splitMsg{}, errf(http.StatusBadRequest, CodeInvalid, strings.TrimPrefix(err.Error(), schema.ErrBadMsg.Error()+": "))
	}
	return sm, nil
}

// splitMsg is a msg as the route read it: split once, by discriminant disc.
type splitMsg struct {
	msg, payload json.RawMessage
	variant      string
	disc         string
}

// checkPolicy enforces the tab's policy; a non-nil result is the 200 rejection body.
func (c *call) checkPolicy(sm splitMsg) (*schema.Rejection, *schema.Policy, *apiError) {
	variant := sm.variant
	pol, err := c.s.policy(c.ctx, c.tid)
	switch {
	case errors.Is(err, errCompileBusy):
		return nil, nil, &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited, retryAfter: 2000,
			detail: "lapd is busy compiling app policies; retry in a few seconds"}
	case errors.Is(err, errCompileQuota):
		return nil, nil, &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited, retryAfter: compileEvery.Milliseconds(),
			detail: "the app changed its action policy too often; retry in a few seconds"}
	}
	if err != nil {
		return nil, nil, errf(http.StatusInternalServerError, CodeSchemaError, "the app sent an invalid hello.policy: "+err.Error())
	}
	if pol == nil {
		return nil, nil, nil
	}
	var rej *schema.Rejection
	if pol.Discriminant() == sm.disc {
		rej = pol.CheckSplit(sm.variant, sm.payload) // the split the route made
	} else {
		rej = pol.Check(sm.msg) // the tab sent a new policy meanwhile
	}
	if rej != nil {
		if ae := c.admitNow(); ae != nil {
			return nil, nil, ae
		}
		c.auditOutcome(audit.EventMsgBlocked, map[string]any{"variant": variant, "status": "rejected", "reason": rej.Reason, "source": "server-policy"})
		return rej, pol, nil
	}
	return nil, pol, nil
}

func routeMessage(c *call) (any, *apiError) {
	b := c.decodeMessage()
	sm, ae := c.splitMsg(b.Msg)
	if ae != nil {
		return nil, ae
	}
	variant := sm.variant
	key, ok := optString(b.IdempotencyKey)
	if !ok || len(key) > MaxIdempotencyKeyLen {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "idempotencyKey must be a string of at most 200 characters")
	}
	reason, _ := optString(b.Reason)
	c.send, c.sendVariant = true, variant
	run := func() (any, *apiError) { return c.message(&b, sm, reason, key) }
	if key == "" {
		return run()
	}
	// A deferred admit may travel with the call inside do: a refusal is
	// not in doubt, so do drops the key as if it had never run.
	return c.s.idem.do(c.ctx, c.tid, key, run)
}

func (c *call) message(b *messageBody, sm splitMsg, reason, key string) (any, *apiError) {
	variant, payload := sm.variant, sm.payload
	rej, pol, ae := c.checkPolicy(sm)
	if ae != nil {
		return nil, ae
	}
	if rej != nil {
		c.recordBlocked(variant, pol, rej)
		return rej, nil
	}
	wait := timeoutMs(b.TimeoutMs, 5*time.Second)
	rawArgs, err := b.sendArgs(key, c.s.cfg.IdempotencyTTL)
	if err != nil {
		return nil, errf(http.StatusBadRequest, CodeInvalid, err.Error())
	}
	// The tab may answer with a proposal, and the human approve it before
	// Propose below runs: an early answer is parked until then.
	release := c.s.cfg.Confirm.Expect(c.tid)
	defer release()
	res, ae := c.rpc("send_message", json.RawMessage(rawArgs), wait+time.Second)
	if ae != nil {
		return nil, ae
	}
	// Read status and confirmId without decoding the rest (stateDiff,
	// actions), which is only forwarded.
	var out struct{ Status, ConfirmID string }
	jsonscan.Object(res, func(k, v []byte) {
		switch string(k) {
		case "status":
			out.Status = tabStatus(v)
		case "confirmId":
			out.ConfirmID, _ = jsonscan.String(v)
		}
	})
	switch out.Status {
	case "pending-confirmation":
	case "rejected":
		c.auditOutcome(audit.EventMsgBlocked, map[string]any{"variant": variant, "status": out.Status})
		return res, nil
	case "dispatched", "confirmed":
		c.auditOutcome(audit.EventMsgDispatched, map[string]any{"variant": variant, "status": out.Status})
		return res, nil
	default:
		return nil, unknownStatus(res, "send_message")
	}
	if out.ConfirmID == "" {
		return nil, errf(http.StatusInternalServerError, CodeInternal, "the tab proposed a confirmation without a confirmId")
	}
	p := confirm.Pending{TID: c.tid, ConfirmID: out.ConfirmID, Variant: variant, Payload: payload, Reason: reason}
	if pol != nil {
		if a, ok := pol.Variant(variant); ok {
			p.Intent = a.Intent
		}
	}
	if err := c.s.cfg.Confirm.Propose(context.WithoutCancel(c.ctx), p); err != nil {
		if errors.Is(err, confirm.ErrDuplicate) {
			// The tab reused an id still pending for another action: the
			// pending one stands; this one is not recorded.
			return nil, errf(http.StatusConflict, CodeConflict, "the app answered with approval id "+out.ConfirmID+", already waiting for another action; ask the user to answer it in the app (or reload the app), then try again")
		}
		// The tab shows an approval lapd could not record: take it back, so
		// the human is not asked something nobody waits for (an answer
		// would be dropped, the action run for nothing).
		why := "internal"
		switch {
		case errors.Is(err, confirm.ErrTooManyPending):
			why = "too-many-pending"
		case storeerr.Unavailable(err):
			why = CodeUnavailable
		case errors.Is(err, confirm.ErrClosed):
			why = CodeShuttingDown
		}
		_ = c.s.cfg.Registry.Push(c.tid, map[string]any{"t": "confirm-expire", "confirmId": out.ConfirmID, "reason": why})
		switch why {
		case "too-many-pending":
			return nil, errf(http.StatusTooManyRequests, CodeRateLimited, "too many approvals are waiting in this session; ask the user to answer them in the app first, then send the action again (a retry of this same call answers rejected, reason too-many-pending)")
		case CodeUnavailable:
			// Not kept as refused (unlike too-many-pending): a retry with
			// the same idempotencyKey gets the same confirmId from the tab,
			// records it and shows it again (resyncApproval below).
			return nil, unavailable("lapd could not record the approval (the approvals store did not answer: in a cluster, NATS is electing a leader or cannot be reached); the app withdrew it; retry in a few seconds (with the same idempotencyKey, the app shows the same approval again)")
		case CodeShuttingDown:
			return nil, errShuttingDown
		}
		return nil, &apiError{status: http.StatusInternalServerError, code: CodeInternal, detail: "lapd could not record the approval (a storage error on the server, in its log); the app withdrew it", cause: err}
	}
	release()
	// The tab learns the approval's deadline (expiresAt), which its
	// proposal could not know, so its prompt can say when it lapses; and a
	// retry with the same idempotencyKey may have recorded an approval the
	// tab took back above: this shows it again.
	c.resyncApproval(out.ConfirmID)
	c.auditOutcome(audit.EventConfirmProposed, map[string]any{"variant": variant, "confirmId": out.ConfirmID})
	body, done := c.awaitConfirm(out.ConfirmID, variant, timeoutMs(b.ApprovalTimeoutMs, wait))
	if !done {
		return map[string]any{"status": "pending-confirmation", "confirmId": out.ConfirmID}, nil
	}
	return body, nil
}

// resyncApproval sends the tab confirm-sync with approval id if it is
// pending, after every proposal lapd records. It carries lapd's deadline
// for it (expiresAt), which a tab's own proposal does not know. And after
// a /message whose Propose failed (confirm-expire took the approval back),
// its retry with the same idempotencyKey gets the same confirmId from the
// tab's memory, without the tab proposing it again: this shows it to the
// human again. A tab that holds the approval keeps it (lapd.js takes the
// deadline); one that answered it already sends its answer again (the
// first answer stands).
func (c *call) resyncApproval(id string) {
	for _, p := range c.s.cfg.Confirm.PendingFor(c.tid) {
		if p.ConfirmID == id {
			_ = c.s.cfg.Registry.Push(c.tid, map[string]any{"t": "confirm-sync", "pending": []confirm.Pending{p}})
			return
		}
	}
}

// approvalContext bounds an approval wait: wait, lapd draining, or the
// tab's socket closing (as the reference's confirm waits, which resolve as
// timeout on close). Only the wait ends: the approval stays pending and is
// shown again when the tab re-pairs.
func (c *call) approvalContext(wait time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := c.s.pollContext(c.ctx, wait)
	if f := c.s.testApprovalWait.Load(); f != nil {
		(*f)()
	}
	if c.gone == nil {
		return ctx, cancel
	}
	stop := context.AfterFunc(c.gone, cancel)
	return ctx, func() { stop(); cancel() }
}

// awaitConfirm long-polls an approval; done=false when it is still pending.
func (c *call) awaitConfirm(confirmID, variant string, wait time.Duration) (any, bool) {
	ctx, cancel := c.approvalContext(wait)
	defer cancel()
	r, err := c.s.cfg.Confirm.Wait(ctx, c.tid, confirmID)
	if err != nil {
		return nil, false
	}
	if variant == "" {
		variant = r.Variant
	}
	d := map[string]any{"confirmId": confirmID}
	if variant != "" {
		d["variant"] = variant
	}
	if r.Status == "confirmed" {
		c.auditOutcome(audit.EventConfirmApproved, d)
		return concat(`{"status":"confirmed","stateAfter":`, orNull(r.StateAfter), `}`), true
	}
	reason := r.Reason
	if reason == "" {
		reason = "user-cancelled"
	}
	if reason == "user-cancelled" {
		_ = c.s.cfg.Registry.Push(c.tid, map[string]any{"t": "confirm-expire", "confirmId": confirmID})
		c.auditOutcome(audit.EventConfirmRejected, d)
	}
	return map[string]string{"status": "rejected", "reason": reason}, true
}

func routeConfirmResult(c *call) (any, *apiError) {
	var b struct {
		ConfirmID json.RawMessage `json:"confirmId"`
		TimeoutMs json.RawMessage `json:"timeoutMs"`
	}
	c.decode(&b)
	id, ok := optString(b.ConfirmID)
	if !ok || id == "" {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "confirmId required")
	}
	wait := timeoutMs(b.TimeoutMs, 5*time.Second)
	c.audit = map[string]any{"tool": "get_confirm_result", "confirmId": id}
	ctx, cancel := c.approvalContext(wait)
	defer cancel()
	_, err := c.s.cfg.Confirm.Wait(ctx, c.tid, id)
	if errors.Is(err, confirm.ErrUnknown) && c.gone != nil && c.gone.Err() != nil {
		// The tab closed: in a cluster the read of an id this node does not
		// hold was cut short with the wait, so "unknown" is not known.
		return json.RawMessage(`{"status":"still-pending"}`), nil
	}
	if errors.Is(err, confirm.ErrUnknown) {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "unknown confirmId "+id+" for this session (it was never proposed here, or its outcome is older than the keep window, 5 minutes by default): call observe to see the current state, and send_message again if the action is still wanted")
	}
	if err != nil {
		if c.ctx.Err() != nil {
			return nil, errf(http.StatusGatewayTimeout, CodeTimeout, "request cancelled")
		}
		if ctx.Err() == nil && storeerr.Unavailable(err) {
			// This node does not hold the id and the cluster's store did
			// not answer: it may exist, so not "unknown confirmId".
			return nil, unavailable("lapd could not read the approval (the approvals store did not answer: in a cluster, NATS is electing a leader or cannot be reached); retry in a few seconds")
		}
		return json.RawMessage(`{"status":"still-pending"}`), nil
	}
	body, done := c.awaitConfirm(id, "", wait)
	if !done {
		return json.RawMessage(`{"status":"still-pending"}`), nil
	}
	return body, nil
}

func routeWouldDispatch(c *call) (any, *apiError) {
	var b struct {
		Msg json.RawMessage `json:"msg"`
	}
	c.decode(&b)
	sm, ae := c.splitMsg(b.Msg)
	if ae != nil {
		return nil, ae
	}
	c.audit = map[string]any{"tool": "would_dispatch", "variant": sm.variant}
	rej, _, ae := c.checkPolicy(sm)
	if ae != nil {
		return nil, ae
	}
	if rej != nil {
		return wouldDispatchRejection(rej, b.Msg), nil
	}
	args, _ := json.Marshal(map[string]json.RawMessage{"msg": b.Msg})
	res, ae := c.rpc("would_dispatch", json.RawMessage(args), 0)
	if ae != nil {
		return nil, ae
	}
	var status string
	jsonscan.Object(res, func(k, v []byte) {
		if string(k) == "status" {
			status, _ = jsonscan.String(v)
		}
	})
	switch status {
	case "predicted", "rejected", "reducer-threw":
		return res, nil
	}
	return nil, unknownStatus(res, "would_dispatch")
}

// unknownStatus is the 500 for a tab's reply whose status lapd does not
// know (the reference: 500 internal "unknown browser status"). For
// send_message the action may have run: marked in doubt, so a retry with the
// same idempotencyKey is not dispatched again.
func unknownStatus(res json.RawMessage, tool string) *apiError {
	what := "a reply that is not a JSON object"
	if t := trimSpace(res); len(t) > 0 && t[0] == '{' {
		what = "a status lapd does not know"
		var st struct {
			Status json.RawMessage `json:"status"`
		}
		if json.Unmarshal(t, &st) == nil && len(st.Status) > 0 && len(st.Status) <= 64 {
			what = "status " + string(st.Status) + ", which lapd does not know"
		}
	}
	if tool == "would_dispatch" {
		return errf(http.StatusInternalServerError, CodeInternal, "unknown browser status: the app's lapd client answered would_dispatch with "+what+
			" (expected predicted, rejected or reducer-threw); the app's client may be newer or older than this lapd: call observe, and tell the user if it keeps happening")
	}
	e := errf(http.StatusInternalServerError, CodeInternal, "unknown browser status: the app's lapd client answered send_message with "+what+
		" (expected dispatched, rejected or pending-confirmation), and the action may have run: call observe to see whether it took effect before sending it again")
	e.inDoubt = true
	return e
}

// tabStatus reads a send_message result's status; the usual ones without
// allocating.
func tabStatus(v []byte) string {
	switch string(v) {
	case `"dispatched"`:
		return "dispatched"
	case `"rejected"`:
		return "rejected"
	case `"pending-confirmation"`:
		return "pending-confirmation"
	}
	s, _ := jsonscan.String(v)
	return s
}
