// Package audit records what happened in lapd, for the humans who own it.
// Audit is not logging: every entry goes to every Sink, nothing is dropped
// silently, and tokens never appear.
//
// Build a Log from the sinks you want and hand it to the servers:
//
//	file, err := audit.OpenJSONLFile("/var/log/lapd/audit.jsonl") // append, 0600
//	db, err := audit.NewSQLiteSink(sqlDB)                           // table audit_entries
//	db.SetRetention(audit.Retention{MaxAge: 30 * 24 * time.Hour, MaxBytes: 1 << 30})
//	log := audit.New(audit.Config{
//		Sinks:  []audit.Sink{audit.NewJSONLSink(os.Stdout), file, db},
//		Logger: slog.Default(), // where sink failures and overflows are reported
//	})
//	defer log.Close() // writes what is queued, then closes every sink
//
//	log.Record(ctx, audit.Entry{TID: tid, UID: uid, Event: audit.EventMint,
//		Detail: map[string]any{"origin": origin}})
//
// # Off the request path
//
// Record stamps At (Unix ms) when it is zero and queues the entry; it does
// no I/O. One writer goroutine (running only while there is something to
// write) takes everything queued as one batch, copies each Detail (every
// agent token or tab secret inside a string becomes "agt_…redacted", long
// strings are cut to MaxDetailString bytes), encodes each entry once, and
// hands the batch to every sink: a BatchSink stores it at once — the SQLite
// sink in one transaction, a JSONL sink with one write — which is the group
// commit that keeps a busy server's audit cheap. The writer lingers up to
// Config.Linger (25 ms) for a batch to fill; Flush and Close never wait for
// that.
//
// The queue is bounded (Config.QueueSize). When it is full, Record holds
// its caller back until there is room (backpressure), at most
// Config.FullWait; after that the entry is dropped and counted (Dropped),
// the drop is logged, and an audit-overflow entry in the stream says how
// many entries of which events were lost — never silently. Close writes
// every queued entry before closing the sinks; an entry recorded after
// Close is written to the Logger instead (and counted). A sink failure is
// counted (Failures) and logged, naming the sink. A nil *Log discards
// everything.
//
// RecordLimited is Record within a budget per source (a client address, a
// tab): a flood of refusals or tab frames becomes one summary entry per
// window with its count (see RecordLimited).
//
// Every sink writes the wire shape of the reference, one entry per line for
// JSONL:
//
//	{"at":1764000000000,"tid":"3f1c…","uid":null,"event":"mint","detail":{"origin":"https://app.example"}}
//
// The JSONL file sink and the SQLite sink are also a Querier: Query returns
// the entries matching a Filter (tid, event, time window, newest N), which
// is what `lapd audit` prints, one FormatText line each. Both can bound what
// they keep (SetRetention).
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
	EventAuditOverflow  = "audit-overflow"  // the audit queue was full: detail {dropped, events{name: n}, since, until}
	EventAdmin          = "admin"           // an operator acted in the admin console: detail {action, ip, …}
)

// Events lists every event name above, in that order (for validating a
// filter, e.g. `lapd audit --event`).
func Events() []string {
	return []string{EventMint, EventClaim, EventRevoke, EventLapCall, EventMsgDispatched, EventMsgBlocked,
		EventConfirmProposed, EventConfirmApproved, EventConfirmRejected, EventRateLimited, EventAuthFailed,
		EventResume, EventRefused, EventConfirmExpired, EventDisconnect, EventSupersede, EventAuditOverflow, EventAdmin}
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
// error means the entry was NOT stored (the Log reports it).
type Sink interface {
	Write(ctx context.Context, e Entry) error
	Close() error
}

// BatchSink is a Sink that stores a whole batch at once (one transaction,
// one write): the Log's writer calls WriteBatch instead of Write when a sink
// has it. An error means no entry of the batch was stored.
type BatchSink interface {
	Sink
	WriteBatch(ctx context.Context, b *Batch) error
}
