package lap

import (
	"context"
	"encoding/json"
	"unicode/utf8"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/confirm"
	"github.com/lapd-dev/lapd/pairing"
)

// onPaired: a re-pair gets {t:'active'} at once (with "model":false when no
// model has used the token yet); pending approvals are re-delivered with
// confirm-sync.
func (s *Server) onPaired(tid string, repair bool) {
	s.tabsMu.Lock()
	s.tabs[tid] = struct{}{}
	s.tabsMu.Unlock()
	if repair {
		f := activeFrame
		if rec, err := s.cfg.Tokens.Get(context.Background(), tid); err == nil && !rec.Used {
			f = repairedFrame
		}
		_ = s.cfg.Registry.Push(tid, f)
	}
	if p := s.cfg.Confirm.PendingFor(tid); len(p) > 0 {
		_ = s.cfg.Registry.Push(tid, map[string]any{"t": "confirm-sync", "pending": p})
	}
}

func (s *Server) onClosed(tid string) {
	s.tabsMu.Lock()
	delete(s.tabs, tid)
	s.tabsMu.Unlock()
	s.policies.drop(tid)
	s.descs.drop(tid)
}

func (s *Server) onConfirmResolved(tid string, r pairing.ConfirmResolved) {
	res := confirm.Resolution{Status: "confirmed", StateAfter: r.StateAfter}
	if r.Outcome != "confirmed" {
		res = confirm.Resolution{Status: "rejected", Reason: "user-cancelled"}
	}
	s.cfg.Confirm.Resolve(context.Background(), tid, r.ConfirmID, res)
}

// onLogAppend audits what the tab logs, once: an entry that echoes a call
// the server made (the rpc it answered, a narration it was pushed) is
// already in the audit as that call's lap-call entry and only goes to the
// ring (/recent-actions); anything else the tab logs is audited as a
// client-log lap-call within two budgets (audit.Log.RecordPooled): the
// tab's own (10 entries, then 1/s) and one shared by every tab
// (ClientLogPool: 100 entries, then 20/s). Past either, entries become one
// counted summary per 10 s for all tabs, so 1,000 tabs flooding cost at
// most about 20 entries a second, not 1,000. Each field is cut to
// MaxClientLogField bytes: lapd.js's own entries carry a kind ("read"), a
// variant (a msg type) and an intent (the app's sentence for an action, or
// "Query state: <path>"), well within it.
func (s *Server) onLogAppend(tid string, entry json.RawMessage, echo bool) {
	if echo {
		return
	}
	var e struct {
		At      int64  `json:"at"`
		Kind    string `json:"kind"`
		Variant string `json:"variant"`
		Intent  string `json:"intent"`
	}
	_ = json.Unmarshal(entry, &e)
	d := map[string]any{"source": "client-log", "kind": clip(e.Kind, MaxClientLogField)}
	if e.Variant != "" {
		d["variant"] = clip(e.Variant, MaxClientLogField)
	}
	if e.Intent != "" {
		d["intent"] = clip(e.Intent, MaxClientLogField)
	}
	s.cfg.Audit.RecordPooled(context.Background(), "tab:"+tid, ClientLogPool, audit.Entry{At: e.At, TID: tid, Event: audit.EventLapCall, Detail: d})
}

const (
	// ClientLogPool is the audit budget every tab's unsolicited log
	// entries share (the "budget" of their summaries).
	ClientLogPool = "client-log"
	// MaxClientLogField is the longest kind, variant or intent of a
	// client-log audit entry, in bytes; longer ones are cut and end in "…".
	MaxClientLogField = 200
)

// clip cuts s to at most n bytes at a rune boundary, marking the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// OnConfirmExpire is confirm.Config.OnExpire: it tells the tab (confirm-expire
// with the reason: "timeout", or "too-many-pending" for an approval expired
// to make room for another session's) and audits confirm-expired. The
// composition root passes it to confirm.New before the Server exists, e.g.
// through a closure, or sets it with confirm.Manager.SetOnExpire.
func (s *Server) OnConfirmExpire(p confirm.Pending) {
	reason := confirm.ReasonTimeout
	if p.Outcome != nil && p.Outcome.Reason != "" {
		reason = p.Outcome.Reason
	}
	// Audited first: whoever sees the frame finds the entry queued.
	s.cfg.Audit.Record(context.Background(), audit.Entry{TID: p.TID, Event: audit.EventConfirmExpired,
		Detail: map[string]any{"confirmId": p.ConfirmID, "variant": p.Variant, "reason": reason}})
	_ = s.cfg.Registry.Push(p.TID, map[string]any{"t": "confirm-expire", "confirmId": p.ConfirmID, "reason": reason})
}

// PairedTabs is how many tids have a live socket (for /healthz).
func (s *Server) PairedTabs() int {
	s.tabsMu.Lock()
	defer s.tabsMu.Unlock()
	return len(s.tabs)
}
