package lap

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
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

// msgType returns msg.type when msg is an object with a string type.
func msgType(raw json.RawMessage) (string, bool) {
	b := trimSpace(raw)
	if len(b) == 0 || b[0] != '{' {
		return "", false
	}
	var m struct {
		Type json.RawMessage `json:"type"`
	}
	if json.Unmarshal(b, &m) != nil || len(m.Type) == 0 {
		return "", false
	}
	var t string
	if json.Unmarshal(m.Type, &t) != nil {
		return "", false
	}
	return t, true
}

// payloadOf is msg without its type field.
func payloadOf(msg json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil {
		return nil
	}
	delete(m, "type")
	b, _ := json.Marshal(m)
	return b
}

// policyCache keeps each tid's compiled hello.policy, keyed by its bytes.
type policyCache struct {
	mu sync.Mutex
	m  map[string]policyEntry
}

type policyEntry struct {
	raw []byte
	pol *schema.Policy
	err error
}

// policy returns tid's compiled policy: nil when the tab sent none.
func (s *Server) policy(tid string) (*schema.Policy, error) {
	h, ok := s.cfg.Registry.Hello(tid)
	if !ok || len(trimSpace(h.Policy)) == 0 || string(trimSpace(h.Policy)) == "null" {
		return nil, nil
	}
	pc := &s.policies
	pc.mu.Lock()
	e, ok := pc.m[tid]
	pc.mu.Unlock()
	if ok && bytes.Equal(e.raw, h.Policy) {
		return e.pol, e.err
	}
	pol, err := schema.Parse(h.Policy)
	pc.mu.Lock()
	if pc.m == nil {
		pc.m = map[string]policyEntry{}
	}
	pc.m[tid] = policyEntry{raw: append([]byte(nil), h.Policy...), pol: pol, err: err}
	pc.mu.Unlock()
	return pol, err
}

func (pc *policyCache) drop(tid string) {
	pc.mu.Lock()
	delete(pc.m, tid)
	pc.mu.Unlock()
}

// checkPolicy enforces the tab's policy; a non-nil result is the 200 rejection body.
func (c *call) checkPolicy(msg json.RawMessage, variant string) (*schema.Rejection, *schema.Policy, *apiError) {
	pol, err := c.s.policy(c.tid)
	if err != nil {
		return nil, nil, errf(http.StatusInternalServerError, CodeSchemaError, "the app sent an invalid hello.policy: "+err.Error())
	}
	if pol == nil {
		return nil, nil, nil
	}
	if rej := pol.Check(msg); rej != nil {
		c.s.audit(c.ctx, c.tid, c.rec.UID, audit.EventMsgBlocked, map[string]any{"variant": variant, "status": "rejected", "reason": rej.Reason, "source": "server-policy"})
		return rej, pol, nil
	}
	return nil, pol, nil
}

func routeMessage(c *call) (any, *apiError) {
	var b messageBody
	c.decode(&b)
	variant, ok := msgType(b.Msg)
	if !ok {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "msg.type must be a string")
	}
	key, ok := optString(b.IdempotencyKey)
	if !ok || len(key) > MaxIdempotencyKeyLen {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "idempotencyKey must be a string of at most 200 characters")
	}
	reason, _ := optString(b.Reason)
	c.audit = map[string]any{"tool": "send_message", "variant": variant}
	run := func() (any, *apiError) { return c.message(b, variant, reason) }
	if key == "" {
		return run()
	}
	return c.s.idem.do(c.ctx, c.tid, key, run)
}

func (c *call) message(b messageBody, variant, reason string) (any, *apiError) {
	rej, pol, ae := c.checkPolicy(b.Msg, variant)
	if ae != nil {
		return nil, ae
	}
	if rej != nil {
		c.recordBlocked(variant, pol, rej)
		return rej, nil
	}
	wait := timeoutMs(b.TimeoutMs, 5*time.Second)
	args := map[string]json.RawMessage{"msg": b.Msg}
	for k, v := range map[string]json.RawMessage{"reason": b.Reason, "waitFor": b.WaitFor, "drainQuietMs": b.DrainQuietMs, "timeoutMs": b.TimeoutMs, "includeState": b.IncludeState} {
		if len(v) > 0 {
			args[k] = v
		}
	}
	rawArgs, err := json.Marshal(args)
	if err != nil {
		return nil, errf(http.StatusBadRequest, CodeInvalid, err.Error())
	}
	res, ae := c.rpc("send_message", json.RawMessage(rawArgs), wait+time.Second)
	if ae != nil {
		return nil, ae
	}
	var out struct {
		Status    string `json:"status"`
		ConfirmID string `json:"confirmId"`
	}
	_ = json.Unmarshal(res, &out)
	switch out.Status {
	case "pending-confirmation":
	case "rejected":
		c.s.audit(c.ctx, c.tid, c.rec.UID, audit.EventMsgBlocked, map[string]any{"variant": variant, "status": out.Status})
		return res, nil
	default:
		c.s.audit(c.ctx, c.tid, c.rec.UID, audit.EventMsgDispatched, map[string]any{"variant": variant, "status": out.Status})
		return res, nil
	}
	if out.ConfirmID == "" {
		return nil, errf(http.StatusInternalServerError, CodeInternal, "the tab proposed a confirmation without a confirmId")
	}
	p := confirm.Pending{TID: c.tid, ConfirmID: out.ConfirmID, Variant: variant, Payload: payloadOf(b.Msg), Reason: reason}
	if pol != nil {
		if a, ok := pol.Variant(variant); ok {
			p.Intent = a.Intent
		}
	}
	if err := c.s.cfg.Confirm.Propose(context.WithoutCancel(c.ctx), p); err != nil {
		return nil, errf(http.StatusInternalServerError, CodeInternal, "recording the approval: "+err.Error())
	}
	c.s.audit(c.ctx, c.tid, c.rec.UID, audit.EventConfirmProposed, map[string]any{"variant": variant, "confirmId": out.ConfirmID})
	body, done := c.awaitConfirm(out.ConfirmID, variant, timeoutMs(b.ApprovalTimeoutMs, wait))
	if !done {
		return map[string]any{"status": "pending-confirmation", "confirmId": out.ConfirmID}, nil
	}
	return body, nil
}

// awaitConfirm long-polls an approval; done=false when it is still pending.
func (c *call) awaitConfirm(confirmID, variant string, wait time.Duration) (any, bool) {
	ctx, cancel := context.WithTimeout(c.ctx, wait)
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
		c.s.audit(c.ctx, c.tid, c.rec.UID, audit.EventConfirmApproved, d)
		return concat(`{"status":"confirmed","stateAfter":`, orNull(r.StateAfter), `}`), true
	}
	reason := r.Reason
	if reason == "" {
		reason = "user-cancelled"
	}
	if reason == "user-cancelled" {
		_ = c.s.cfg.Registry.Push(c.tid, map[string]any{"t": "confirm-expire", "confirmId": confirmID})
		c.s.audit(c.ctx, c.tid, c.rec.UID, audit.EventConfirmRejected, d)
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
	ctx, cancel := context.WithTimeout(c.ctx, wait)
	defer cancel()
	_, err := c.s.cfg.Confirm.Wait(ctx, c.tid, id)
	if errors.Is(err, confirm.ErrUnknown) {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "unknown confirmId "+id+" for this session (it was never proposed here, or its outcome is older than the keep window, 5 minutes by default): call observe to see the current state, and send_message again if the action is still wanted")
	}
	if err != nil {
		if c.ctx.Err() != nil {
			return nil, errf(http.StatusGatewayTimeout, CodeTimeout, "request cancelled")
		}
		return json.RawMessage(`{"status":"still-pending"}`), nil
	}
	body, _ := c.awaitConfirm(id, "", wait)
	return body, nil
}

func routeWouldDispatch(c *call) (any, *apiError) {
	var b struct {
		Msg json.RawMessage `json:"msg"`
	}
	c.decode(&b)
	variant, ok := msgType(b.Msg)
	if !ok {
		return nil, errf(http.StatusBadRequest, CodeInvalid, "msg with a string type required")
	}
	c.audit = map[string]any{"tool": "would_dispatch", "variant": variant}
	rej, _, ae := c.checkPolicy(b.Msg, variant)
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
	return res, nil
}
