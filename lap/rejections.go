package lap

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/lapd-dev/lapd/schema"
)

// recordBlocked makes a /message that the server's policy refused visible
// where a refusal by the tab would be: a kind "blocked" entry in the tid's
// recent-actions ring (so describe_recent_actions {kind:"blocked"} lists it,
// as the reference's does for the tab's refusals), and a {t:"log-show"} frame
// so that the panel's activity feed shows it too. log-show is lapd's: a
// client that does not know it ignores it, and a client that does shows the
// entry without echoing it back (it is already in the ring). The refusal
// itself is audited by checkPolicy (msg-blocked).
func (c *call) recordBlocked(variant string, pol *schema.Policy, rej *schema.Rejection) {
	now := c.s.cfg.Tokens.Now()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	intent := variant
	if pol != nil {
		if a, ok := pol.Variant(variant); ok && a.Intent != "" {
			intent = a.Intent
		}
	}
	entry, err := json.Marshal(map[string]any{
		"id": "blocked-" + strconv.FormatInt(now, 10) + "-" + hex.EncodeToString(rnd[:]),
		"at": now, "kind": "blocked", "variant": variant, "intent": intent,
		"detail": rej.Reason + ": " + rej.Detail, "source": "server",
	})
	if err != nil {
		return
	}
	if c.s.cfg.Registry.AppendLog(c.tid, entry) != nil {
		return // the tab went away: nothing to show it on
	}
	_ = c.s.cfg.Registry.Push(c.tid, logShowFrame(entry))
}

func logShowFrame(entry json.RawMessage) json.RawMessage {
	return concat(`{"t":"log-show","entry":`, entry, `}`)
}

// wouldDispatchRejection is /would-dispatch's answer to a msg the policy
// refused. A payload that fails its schema is answered in the reference
// runtime's shape, {status:"rejected", reason:"schema-mismatch",
// errors:[{path, code, message}]}, with the reference's path style
// ("cells[0].value") and codes, so a client written for the reference reads
// it unchanged; lapd adds detail and each error's JSON Pointer. Other
// refusals (human-only, invalid) are the same shape in both.
func wouldDispatchRejection(rej *schema.Rejection, msg json.RawMessage) any {
	if rej.Reason != schema.ReasonSchemaError {
		return rej
	}
	type refError struct {
		Path    string `json:"path"`
		Code    string `json:"code"`
		Message string `json:"message"`
		Pointer string `json:"pointer"`
	}
	errs := make([]refError, 0, len(rej.Errors))
	for _, fe := range rej.Errors {
		errs = append(errs, refError{Path: schema.ReferencePath(fe.Path, msg), Code: fe.Code, Message: fe.Message, Pointer: fe.Path})
	}
	return map[string]any{"status": "rejected", "reason": "schema-mismatch", "errors": errs, "detail": rej.Detail}
}
