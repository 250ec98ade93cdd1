package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/lapd-dev/lapd/lap"
)

// send_message: one action (msg) or several (msgs), each one LAP /message
// call with its own idempotency key, so LAP validates, audits and dedupes
// every message on its own. A batch runs in order and stops at the first
// message that is not dispatched (rejected, pending confirmation, or a
// failure of the call). Refusals by the app, its policy or the user are
// results (isError false) with a status, a reason and a next step; only a
// failure of the tool itself (lapd unreachable, paused past the budget, bad
// arguments) is an isError result.

// outcome is one message's LAP /message body.
type outcome struct {
	variant string
	raw     []byte
	ms      []member
	status  string
}

// ok reports whether the message ran (the batch goes on).
func (o outcome) ok() bool { return o.status == "dispatched" || o.status == "confirmed" }

// msgKey is message i's idempotency key: the call's key for a single msg,
// key#1, key#2, … for a batch.
func msgKey(key string, batch bool, i int) string {
	if !batch {
		return key
	}
	return key + "#" + strconv.Itoa(i+1)
}

func (e *Executor) sendMessage(ctx context.Context, d toolDef, a args, b Binding, p *progress) (*mcpgo.CallToolResult, error) {
	batch := a.has("msgs")
	msgs, _ := a["msgs"].([]any)
	if !batch {
		msgs = []any{a["msg"]}
	}
	key := a.str("idempotencyKey")
	if key == "" {
		key = newIdempotencyKey()
	}
	if batch && len(msgKey(key, true, len(msgs)-1)) > lap.MaxIdempotencyKeyLen {
		return nil, invalidArgs("with msgs the idempotencyKey must leave room for #%d (at most %d characters in all)", len(msgs), lap.MaxIdempotencyKeyLen)
	}
	common := map[string]any{}
	for _, k := range []string{"reason", "waitFor", "drainQuietMs", "timeoutMs"} {
		if a.has(k) {
			common[k] = a[k]
		}
	}
	approval := a.ms("approvalTimeoutMs", e.cfg.Budgets.ApprovalTimeout)
	common["approvalTimeoutMs"] = approval.Milliseconds()
	budget := e.budget(d, a)
	retryWithin := a.ms("timeoutMs", e.cfg.Budgets.MessageTimeout) + e.cfg.Budgets.Slack
	outs := make([]outcome, 0, len(msgs))
	for i, m := range msgs {
		body := maps.Clone(common)
		body["msg"] = m
		body["idempotencyKey"] = msgKey(key, batch, i)
		if i == len(msgs)-1 && a.has("includeState") {
			body["includeState"] = a["includeState"]
		}
		variant, _ := m.(map[string]any)["type"].(string)
		if batch {
			p.Set(fmt.Sprintf("dispatching %s (%d of %d) and waiting for its effects to settle…", variant, i+1, len(msgs)))
		} else {
			p.Set("dispatching " + variant + " and waiting for its effects to settle…")
		}
		raw, err := e.callRetryWithin(ctx, b, "/message", body, budget, retryWithin, p)
		if err != nil {
			return nil, e.dispatchFailed(err, b, key, batch, len(msgs), outs)
		}
		ms, ok := members(raw)
		if !ok {
			return nil, e.dispatchFailed(errUnexpected, b, key, batch, len(msgs), outs)
		}
		oc := outcome{variant: variant, raw: raw, ms: ms, status: jstr(get(ms, "status"))}
		outs = append(outs, oc)
		if !oc.ok() {
			break
		}
	}
	c := combine(outs)
	e.noteDispatch(b, c)
	if a.verbose() {
		return e.renderVerbose(b, key, batch, len(msgs), outs, approval), nil
	}
	return e.renderDispatch(b, batch, len(msgs), outs, c, approval), nil
}

// noteDispatch records what the outcomes show the model of the state
// (view.go): a stateAfter replaces the view, a stateDiff extends it.
func (e *Executor) noteDispatch(b Binding, c combined) {
	ops, after, asked := c.ops, c.after, c.asked
	if after == nil && len(ops) == 0 {
		return
	}
	var patch []byte
	if len(ops) > 0 && !asked {
		patch = encodePatch(nil, ops)
	}
	e.bindings.Update(b.Handle, func(b *Binding) {
		if after != nil {
			b.setView(after)
		}
		if patch != nil {
			b.addViewPatch(patch)
		}
	})
}

// dispatchFailed is a tool failure during message len(outs) (0-based). The
// messages before it ran; the result says which, and that the same call
// with the same idempotencyKey is safe to repeat.
func (e *Executor) dispatchFailed(err error, b Binding, key string, batch bool, n int, outs []outcome) *toolError {
	te := fromLAP(err, b.Base)
	extra := map[string]any{"idempotencyKey": key}
	for k, v := range te.Extra {
		extra[k] = v
	}
	te.Extra = extra
	if !batch {
		return te
	}
	results := make([]json.RawMessage, n)
	for i := range results {
		switch {
		case i < len(outs):
			results[i] = resultEntry(outs[i])
		case i == len(outs):
			results[i] = json.RawMessage(`{"status":"failed"}`)
		default:
			results[i] = json.RawMessage(`{"status":"not-sent"}`)
		}
	}
	extra["results"] = results
	if ops := combine(outs).ops; len(ops) > 0 {
		extra["stateDiff"] = json.RawMessage(encodePatch(nil, ops))
	}
	te.Hint += fmt.Sprintf(" Message %d of %d failed; those before it were dispatched. Repeating this call with the same idempotencyKey does not dispatch them twice.", len(outs)+1, n)
	return te
}

// combine merges the outcomes' state changes: the JSON Patch of every
// dispatched message (squashed), restarting after a confirmed one, whose
// stateAfter is then returned (asked is false: nobody asked for it). A
// dispatched message's stateAfter (includeState) is returned with asked true.
// combined is what combine makes of a call's outcomes.
type combined struct {
	ops   []patchOp // the change after the last stateAfter (squashed)
	after []byte    // the last stateAfter: a confirmed one, or one asked for
	asked bool      // after was asked for (includeState), not a confirmation's
}

func combine(outs []outcome) combined {
	var (
		ops   []patchOp
		after []byte
		asked bool
	)
	for _, oc := range outs {
		switch oc.status {
		case "dispatched":
			if d := get(oc.ms, "stateDiff"); d != nil {
				if ps, ok := patchOps(d); ok {
					ops = append(ops, ps...)
				}
			}
			if sa := get(oc.ms, "stateAfter"); sa != nil {
				after, asked = sa, true
			}
		case "confirmed":
			after, asked = get(oc.ms, "stateAfter"), false
			ops = ops[:0]
		}
	}
	return combined{ops: squashPatch(ops), after: after, asked: asked}
}

// skipInEntry are the members of a /message body that the combined result
// carries instead of each message's entry.
var skipInEntry = map[string]bool{"status": true, "stateDiff": true, "actions": true, "stateAfter": true, "drain": true, "idempotencyKey": true}

// writeDetails writes what an outcome says beyond its state change: the
// confirmId, reason, detail, errors…, and drain when it is interesting.
func writeDetails(o *objw, oc outcome) {
	for _, m := range oc.ms {
		if !skipInEntry[m.key] && !isEmpty(m.val) {
			o.raw(m.key, m.val)
		}
	}
	if d := get(oc.ms, "drain"); drainWorthShowing(d) {
		o.raw("drain", leanDrain(d))
	}
}

// leanDrain keeps what a model can act on in a drain report: whether the
// effects timed out, and each error's kind and message. The JS stack
// (up to 1 KB of the app's script URLs per error) and the counters go.
func leanDrain(d []byte) []byte {
	ms, ok := members(d)
	if !ok {
		return d
	}
	o := newObj(make([]byte, 0, 128))
	if isTrue(get(ms, "timedOut")) {
		o.bool("timedOut", true)
	}
	if errs, ok := elements(get(ms, "errors")); ok && len(errs) > 0 {
		o.key("errors")
		o.b = append(o.b, '[')
		for i, e := range errs {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			em, ok := members(e)
			if !ok {
				o.b = append(o.b, e...)
				continue
			}
			eo := newObj(o.b)
			for _, m := range em {
				if m.key != "stack" {
					eo.raw(m.key, m.val)
				}
			}
			o.b = eo.close()
		}
		o.b = append(o.b, ']')
	}
	return o.close()
}

// drainNext is the hint for a dispatch whose drain went wrong, "" if not.
func drainNext(oc outcome) string {
	ms, ok := members(get(oc.ms, "drain"))
	switch {
	case !ok:
		return ""
	case !isEmpty(get(ms, "errors")):
		return "The app reported an error while running it (drain.errors): the state changed only as stateDiff shows. Check msg against the state (ids, values) and fix it, or tell the user what failed."
	case isTrue(get(ms, "timedOut")):
		return "The app's effects had not settled when the wait ended (drain.timedOut): call wait_for_change or observe before relying on the state."
	}
	return ""
}

// drainWorthShowing: only effects that failed or did not settle in time.
func drainWorthShowing(d []byte) bool {
	ms, ok := members(d)
	return ok && (isTrue(get(ms, "timedOut")) || !isEmpty(get(ms, "errors")))
}

// resultEntry is one message's entry in a batch result.
func resultEntry(oc outcome) json.RawMessage {
	o := newObj(nil)
	o.str("status", oc.status)
	writeDetails(o, oc)
	return o.close()
}

// renderDispatch renders the outcomes leanly (see the file comment).
func (e *Executor) renderDispatch(b Binding, batch bool, n int, outs []outcome, c combined, approval time.Duration) *mcpgo.CallToolResult {
	last := outs[len(outs)-1]
	o := newObj(make([]byte, 0, 512))
	status := last.status
	if batch && last.ok() && len(outs) == n {
		status = "dispatched"
	}
	o.str("status", status)
	if batch {
		// One entry per message, unless every one was dispatched with
		// nothing to say (status says it then).
		entries := make([]json.RawMessage, len(outs))
		plain := len(outs) == n
		for i, oc := range outs {
			entries[i] = resultEntry(oc)
			plain = plain && string(entries[i]) == `{"status":"dispatched"}`
		}
		if !plain {
			o.key("results")
			o.b = append(o.b, '[')
			for i := 0; i < n; i++ {
				if i > 0 {
					o.b = append(o.b, ',')
				}
				if i < len(outs) {
					o.b = append(o.b, entries[i]...)
				} else {
					o.b = append(o.b, `{"status":"not-sent"}`...)
				}
			}
			o.b = append(o.b, ']')
		}
	} else {
		writeDetails(o, last)
	}
	ops, after, asked := c.ops, c.after, c.asked
	diffed := false // an approved action's state as a patch from what the model saw
	if after != nil {
		if asked {
			o.raw("stateAfter", after)
		} else if p := viewPatch(b, after); p != nil {
			o.raw("stateDiff", appendOps(p, ops)) // then what the later messages changed
			diffed = true
		} else {
			kept, om := budgetState(after, stateBudget)
			if kept != nil {
				o.raw("stateAfter", kept)
			}
			if om != nil {
				o.raw("stateOmitted", om)
			}
		}
	}
	if !diffed && (len(ops) > 0 || (after == nil && anyStatus(outs, "dispatched"))) {
		o.raw("stateDiff", encodePatch(nil, ops))
	}
	for i := len(outs) - 1; i >= 0; i-- {
		if acts := get(outs[i].ms, "actions"); acts != nil {
			if k, v := e.actionsUpdate(b, acts); k != "" {
				o.raw(k, v)
			}
			break
		}
	}
	if next := dispatchNext(outs, batch, n, approval, after != nil && !asked && !diffed && len(ops) > 0, diffed); next != "" {
		o.str("next", next)
	}
	return result(o.close())
}

func anyStatus(outs []outcome, s string) bool {
	for _, o := range outs {
		if o.status == s {
			return true
		}
	}
	return false
}

// dispatchNext is the hint that leads to the cheapest correct next step.
func dispatchNext(outs []outcome, batch bool, n int, approval time.Duration, afterThenDiff, diffed bool) string {
	last := outs[len(outs)-1]
	var next string
	switch last.status {
	case "dispatched":
		for _, oc := range outs {
			if next = drainNext(oc); next != "" {
				break
			}
		}
	case "confirmed":
		next = "The user approved it and it ran; stateAfter is the current state."
		if diffed {
			next = "The user approved it and it ran; stateDiff is what changed since you last saw the state."
		}
	case "pending-confirmation":
		id := jstr(get(last.ms, "confirmId"))
		if approval > 0 {
			next = fmt.Sprintf("The user did not decide within %d s. ", seconds(approval))
		}
		next += fmt.Sprintf("Tell the user to approve or reject %s in the app, then call get_confirm_result with confirmId=%q.", last.variant, id)
	case "rejected":
		next = rejectionHint(jstr(get(last.ms, "reason")))
	default:
		next = "It was not dispatched: see status and detail."
	}
	if batch && len(outs) < n {
		next += fmt.Sprintf(" Message %d stopped the batch; the %d after it were not sent.", len(outs), n-len(outs))
	}
	if afterThenDiff {
		next = "stateAfter is the state right after the approved action; stateDiff is what the later messages changed. " + next
	}
	return next
}

// rejectionHint says what to do about a refused message.
func rejectionHint(reason string) string {
	switch reason {
	case "human-only":
		return "Only the user can do this: ask them to do it in the app."
	case "user-cancelled":
		return "The user rejected it in the app; do not retry unless they ask."
	case "schema-error", "schema-mismatch":
		return "The payload does not match the action's schema: fix it as errors say and send it again."
	case "invalid":
		return "Not dispatchable now: check the action's name, payload and availability in your action list, then fix msg."
	case "timeout":
		return "Nobody answered the approval in time; ask the user before proposing it again."
	case "revoked":
		return "The user revoked this session; " + askForLine + " if they want to continue."
	case "paused":
		return "The app tab was away; retry in a few seconds."
	}
	return "The app refused it; see reason and detail."
}

// renderVerbose returns the LAP bodies as they came, plus the key and the hint.
func (e *Executor) renderVerbose(b Binding, key string, batch bool, n int, outs []outcome, approval time.Duration) *mcpgo.CallToolResult {
	last := outs[len(outs)-1]
	o := newObj(nil)
	if batch {
		status := last.status
		if last.ok() && len(outs) == n {
			status = "dispatched"
		}
		o.str("status", status)
		o.key("results")
		o.b = append(o.b, '[')
		for i := 0; i < n; i++ {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			if i < len(outs) {
				o.b = append(o.b, outs[i].raw...)
			} else {
				o.b = append(o.b, `{"status":"not-sent"}`...)
			}
		}
		o.b = append(o.b, ']')
	} else {
		withFields(o, last.raw, "idempotencyKey", "next")
	}
	for i := len(outs) - 1; i >= 0; i-- {
		if acts := get(outs[i].ms, "actions"); acts != nil {
			if as, ok := leanActionList(acts, b.sigs); ok {
				e.rememberActions(b.Handle, acts, as)
			}
			break
		}
	}
	o.str("idempotencyKey", key)
	if next := dispatchNext(outs, batch, n, approval, false, false); next != "" {
		o.str("next", next)
	}
	return result(o.close())
}

// confirmResult renders a /confirm-result body.
func (e *Executor) confirmResult(b Binding, raw []byte, verbose bool) (*mcpgo.CallToolResult, error) {
	ms, ok := members(raw)
	if !ok {
		return nil, errUnexpected
	}
	status := jstr(get(ms, "status"))
	diffed := false
	o := newObj(make([]byte, 0, len(raw)+128))
	if verbose {
		withFields(o, raw, "next")
	} else {
		o.str("status", status)
		for _, m := range ms {
			switch {
			case m.key == "status" || isEmpty(m.val):
			case m.key == "stateAfter":
				if p := viewPatch(b, m.val); p != nil && status == "confirmed" {
					o.raw("stateDiff", p)
					diffed = true
					continue
				}
				kept, om := budgetState(m.val, stateBudget)
				if kept != nil {
					o.raw("stateAfter", kept)
				}
				if om != nil {
					o.raw("stateOmitted", om)
				}
			default:
				o.raw(m.key, m.val)
			}
		}
	}
	switch status {
	case "confirmed":
		if diffed {
			o.str("next", "The user approved it and it ran; stateDiff is what changed since you last saw the state.")
		} else {
			o.str("next", "The user approved it and it ran; stateAfter is the current state.")
		}
		if sa := get(ms, "stateAfter"); sa != nil {
			e.bindings.Update(b.Handle, func(b *Binding) { b.setView(sa) })
		}
	case "still-pending":
		o.str("next", "The user has not decided yet; remind them to approve or reject it in the app, then call get_confirm_result again.")
	case "rejected":
		o.str("next", rejectionHint(jstr(get(ms, "reason"))))
	}
	return result(o.close()), nil
}
