package tokens

import (
	"context"
	"time"
)

// Config configures a Manager. Zero values mean the documented defaults.
type Config struct {
	Store      Store            // required
	TTL        time.Duration    // hard expiry from mint/claim; default 24h
	SlidingTTL time.Duration    // 0 = off: when set, LastSeenAt+SlidingTTL < now fails verification (ErrExpired)
	Grace      time.Duration    // pending-resume grace; default 60s; negative = 0 (already expired at close)
	Retention  time.Duration    // dead records are swept once ExpiresAt+Retention has passed; default 1h
	Clock      func() time.Time // default time.Now
}

// Manager implements the token lifecycle over a Store. Safe for concurrent use.
type Manager struct {
	cfg Config
}

// NewManager returns a Manager; it errors if cfg.Store is nil.
func NewManager(cfg Config) (*Manager, error) { panic("tokens: NewManager not implemented") }

// Generate returns a fresh token and its hash.
func Generate() (token, hash string) { panic("not implemented") }

// Hash returns hex(SHA-256(token)) or ErrMalformed when the prefix is missing.
func Hash(token string) (string, error) { panic("not implemented") }

// Mint creates an awaiting-ws record for uid ("" = anonymous) minted from
// origin and returns the plaintext token (shown once) and the record. It also
// sweeps dead records lazily.
func (m *Manager) Mint(ctx context.Context, uid, origin, label string) (string, Record, error) {
	panic("not implemented")
}

// Verify checks a bearer for a LAP call: ErrMalformed/ErrUnknown/ErrExpired
// (hard expiry or sliding TTL) → 401, ErrRevoked → 403. A pending-resume record
// past its grace still verifies (the caller answers 503 paused/expired).
func (m *Manager) Verify(ctx context.Context, token string) (Record, error) { panic("not implemented") }

// Accept is called before a WebSocket upgrade. It verifies the token, refuses a
// pending-resume record past its grace (ErrExpired), and moves the record to
// awaiting-claude (or back to active when it was pending-resume inside grace:
// repair=true).
func (m *Manager) Accept(ctx context.Context, token string) (rec Record, repair bool, err error) {
	panic("not implemented")
}

// Activate moves awaiting-claude → active with label uid ?? label ?? "Claude"
// and reports whether it changed anything (the caller then pushes {t:'active'}).
func (m *Manager) Activate(ctx context.Context, tid string) (Record, bool, error) {
	panic("not implemented")
}

// Disconnected moves active/awaiting-claude → pending-resume with the grace
// deadline. Other statuses are left alone.
func (m *Manager) Disconnected(ctx context.Context, tid string) (Record, error) {
	panic("not implemented")
}

// Touch sets LastSeenAt = now.
func (m *Manager) Touch(ctx context.Context, tid string) error { panic("not implemented") }

// Get returns the record for tid.
func (m *Manager) Get(ctx context.Context, tid string) (Record, error) { panic("not implemented") }

// ResumeList returns uid's records among tids that are pending-resume inside
// their grace window; a missing label reads "(unknown)".
func (m *Manager) ResumeList(ctx context.Context, uid string, tids []string) ([]Record, error) {
	panic("not implemented")
}

// Claim rotates the token of a pending-resume record owned by uid and minted
// from origin, inside its grace window and before hard expiry (unlike the
// reference), and makes it active with a fresh TTL. ErrForbidden otherwise.
func (m *Manager) Claim(ctx context.Context, tid, uid, origin string) (string, Record, error) {
	panic("not implemented")
}

// Revoke makes the record revoked (terminal). ErrForbidden if unknown or owned
// by another uid. Revoking twice is not an error.
func (m *Manager) Revoke(ctx context.Context, tid, uid string) (Record, error) {
	panic("not implemented")
}

// Sessions lists uid's active and pending-resume records ("" uid → none).
func (m *Manager) Sessions(ctx context.Context, uid string) ([]Record, error) {
	panic("not implemented")
}

// Now returns the manager's clock reading in Unix ms.
func (m *Manager) Now() int64 { return m.cfg.Clock().UnixMilli() }
