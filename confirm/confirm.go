// Package confirm keeps pending approvals: an action the LLM proposed that the
// human must approve or reject in the tab. Resolutions are level-triggered
// (kept Keep after they happen, so none is lost between two polls); pending
// approvals are persisted in a Store so they survive a server restart and can
// be re-delivered to a tab that reconnects; one never answered expires after
// Expiry as rejected with reason "timeout".
package confirm

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrUnknown: no pending approval or kept resolution with that id for that tid.
var ErrUnknown = errors.New("confirm: unknown confirmId")

// Pending is a proposed action awaiting the human. Times in Unix ms.
type Pending struct {
	TID        string          `json:"-"`
	ConfirmID  string          `json:"confirmId"`
	Variant    string          `json:"variant"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	Intent     string          `json:"intent,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	ProposedAt int64           `json:"proposedAt"`
	ExpiresAt  int64           `json:"expiresAt"`
}

// Resolution is how an approval ended.
type Resolution struct {
	Status     string          `json:"status"`           // confirmed | rejected
	Reason     string          `json:"reason,omitempty"` // user-cancelled | timeout (rejected only)
	StateAfter json.RawMessage `json:"stateAfter,omitempty"`
	Variant    string          `json:"-"`
	ResolvedAt int64           `json:"-"`
}

// Store persists pending approvals. Safe for concurrent use.
type Store interface {
	Put(ctx context.Context, p Pending) error
	Delete(ctx context.Context, tid, confirmID string) error
	List(ctx context.Context) ([]Pending, error) // every pending approval (load at start)
	Close() error
}

// Config configures a Manager. Zero values mean the documented defaults.
type Config struct {
	Store    Store            // nil = memory only
	Expiry   time.Duration    // unanswered approvals expire; default 10m
	Keep     time.Duration    // resolutions kept; default 5m
	Clock    func() time.Time // default time.Now
	OnExpire func(p Pending)  // called (outside locks) when an approval times out; push confirm-expire here
}

// Manager tracks approvals. Safe for concurrent use.
type Manager struct {
	cfg Config
}

// New loads the store's pending approvals and starts their expiry timers.
func New(ctx context.Context, cfg Config) (*Manager, error) { panic("confirm: New not implemented") }

// Propose records a pending approval (ProposedAt/ExpiresAt filled if zero).
func (m *Manager) Propose(ctx context.Context, p Pending) error { panic("not implemented") }

// Resolve records the outcome for tid/confirmID and wakes its waiters. It
// returns the pending entry and true if it was pending; a second resolution
// of the same id is ignored (first wins).
func (m *Manager) Resolve(ctx context.Context, tid, confirmID string, r Resolution) (Pending, bool) {
	panic("not implemented")
}

// Wait blocks until tid/confirmID is resolved (returning at once if it
// already was, within Keep) or ctx is done (ctx.Err()). ErrUnknown if the id
// is neither pending nor resolved.
func (m *Manager) Wait(ctx context.Context, tid, confirmID string) (Resolution, error) {
	panic("not implemented")
}

// PendingFor lists tid's pending approvals, oldest first.
func (m *Manager) PendingFor(tid string) []Pending { panic("not implemented") }

// Drop forgets everything about tid (revoke).
func (m *Manager) Drop(ctx context.Context, tid string) { panic("not implemented") }

// Close stops timers and closes the store.
func (m *Manager) Close() error { panic("not implemented") }
