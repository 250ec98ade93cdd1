// Package audit records what happened in lapd, for the humans who own it.
// Audit is not logging: every entry goes to every Sink, a failing Sink is
// reported (log + counter) and never silently dropped, and tokens never appear.
//
// Build a Log from the sinks you want and hand it to the servers:
//
//	file, err := audit.OpenJSONLFile("/var/log/lapd/audit.jsonl") // append, 0600
//	db, err := audit.NewSQLiteSink(sqlDB)                           // table audit_entries
//	log := audit.New(audit.Config{
//		Sinks:  []audit.Sink{audit.NewJSONLSink(os.Stdout), file, db},
//		Logger: slog.Default(), // where sink failures are reported
//	})
//	defer log.Close() // closes every sink
//
//	log.Record(ctx, audit.Entry{TID: tid, UID: uid, Event: audit.EventMint,
//		Detail: map[string]any{"origin": origin}})
//
// Record stamps At (Unix ms) when it is zero, copies Detail (replacing every
// agent token or tab secret inside a string by "agt_…redacted" and cutting
// long strings to MaxDetailString bytes), and writes to every sink. It never returns an
// error: a sink failure is counted (Failures) and logged as one warning
// naming the sink's type. A nil *Log discards everything.
//
// Every sink writes the wire shape of the reference, one entry per line for
// JSONL:
//
//	{"at":1764000000000,"tid":"3f1c…","uid":null,"event":"mint","detail":{"origin":"https://app.example"}}
//
// The JSONL file sink and the SQLite sink are also a Querier: Query returns
// the entries matching a Filter (tid, event, time window, newest N), which
// is what `lapd audit` prints, one FormatText line each.
package audit

import (
	"context"
	"encoding/json"
)

// Event names. The first group is the reference's (LAP v2 §2g); the rest are
// lapd's additions.
const (
	EventMint            = "mint"
	EventClaim           = "claim"
	EventRevoke          = "revoke"
	EventLapCall         = "lap-call"
	EventMsgDispatched   = "msg-dispatched"
	EventMsgBlocked      = "msg-blocked"
	EventConfirmProposed = "confirm-proposed"
	EventConfirmApproved = "confirm-approved"
	EventConfirmRejected = "confirm-rejected"
	EventRateLimited     = "rate-limited"
	EventAuthFailed      = "auth-failed"
	EventResume          = "resume"

	// lapd additions.
	EventRefused        = "refused"         // any other refusal: detail {endpoint, status, code}
	EventConfirmExpired = "confirm-expired" // an approval nobody answered timed out
	EventDisconnect     = "disconnect"      // a tab's socket closed: detail {reason}
	EventSupersede      = "supersede"       // a newer socket for a tid replaced a live one (closed 4002): detail {tabSecret, approvals}
	EventAdmin          = "admin"           // an operator acted in the admin console: detail {action, ip, …}
)

// Events lists every event name above, in that order (for validating a
// filter, e.g. `lapd audit --event`).
func Events() []string {
	return []string{EventMint, EventClaim, EventRevoke, EventLapCall, EventMsgDispatched, EventMsgBlocked,
		EventConfirmProposed, EventConfirmApproved, EventConfirmRejected, EventRateLimited, EventAuthFailed,
		EventResume, EventRefused, EventConfirmExpired, EventDisconnect, EventSupersede, EventAdmin}
}

// Entry is one audit record. Wire shape: {at(ms), tid|null, uid|null, event, detail}.
type Entry struct {
	At     int64          `json:"at"`
	TID    string         `json:"tid"`
	UID    string         `json:"uid"`
	Event  string         `json:"event"`
	Detail map[string]any `json:"detail"`

	// RequestID is the id of the LAP or MCP call that caused the entry
	// (Record takes it from the context when empty). Sinks see it as
	// Detail["rid"]: the wire shape stays the reference's.
	RequestID string `json:"-"`
}

// MarshalJSON writes "" tid/uid as null.
func (e Entry) MarshalJSON() ([]byte, error) {
	type wire struct {
		At     int64          `json:"at"`
		TID    *string        `json:"tid"`
		UID    *string        `json:"uid"`
		Event  string         `json:"event"`
		Detail map[string]any `json:"detail"`
	}
	w := wire{At: e.At, Event: e.Event, Detail: e.Detail}
	if e.TID != "" {
		w.TID = &e.TID
	}
	if e.UID != "" {
		w.UID = &e.UID
	}
	if w.Detail == nil {
		w.Detail = map[string]any{}
	}
	return json.Marshal(w)
}

// Sink receives audit entries. Write must be safe for concurrent use; an
// error means the entry was NOT stored (the Logger reports it).
type Sink interface {
	Write(ctx context.Context, e Entry) error
	Close() error
}
