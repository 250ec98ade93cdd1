// Package audit records what happened in lapd, for the humans who own it.
// Audit is not logging: every entry goes to every Sink, a failing Sink is
// reported (log + counter) and never silently dropped, and tokens never appear.
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
)

// Entry is one audit record. Wire shape: {at(ms), tid|null, uid|null, event, detail}.
type Entry struct {
	At     int64          `json:"at"`
	TID    string         `json:"tid"`
	UID    string         `json:"uid"`
	Event  string         `json:"event"`
	Detail map[string]any `json:"detail"`
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
