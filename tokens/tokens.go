// Package tokens owns lapd's agent tokens: their format, hashing, the lifecycle
// of a token record, and the Store that keeps records.
//
// A token is "agt_" followed by base64url (no padding) of 32 CSPRNG bytes. The
// server never stores it: only hex(SHA-256(token)) is kept, and lookups compare
// hashes in constant time. A record moves through these statuses:
//
//	awaiting-ws → awaiting-claude → active ⇄ pending-resume → (claim) active
//	any → revoked (terminal)
//
// Manager implements the transitions over a Store (SQLite by default, or
// memory); it knows nothing about HTTP or WebSocket. The HTTP and WebSocket
// layers call it like this:
//
//	store, err := tokens.OpenSQLite("lapd-data/lapd.db") // or tokens.NewMemoryStore()
//	m, err := tokens.NewManager(tokens.Config{Store: store}) // 24h TTL, 60s grace
//
//	n, err := m.AfterRestart(ctx)                     // start-up: sockets of a crashed process are gone
//	token, tab, rec, err := m.MintTab(ctx, uid, origin, "") // POST /agent/mint: show both once
//	rec, err := m.CheckAcceptTab(ctx, token, tab)     // before the WebSocket upgrade: changes nothing
//	rec, repair, err := m.Connected(ctx, rec.TID, rec.TokenHash, tab) // once the socket is up
//	rec, err = m.Verify(ctx, token)                   // every LAP call: 401/403 on error
//	rec, changed, err := m.Activate(ctx, rec.TID)     // first LAP call: push {t:'active'}
//	rec, err = m.Disconnected(ctx, rec.TID)           // socket closed: grace starts
//	token, tab, rec, err = m.Claim(ctx, tid, origin, tokens.Owner{UID: uid, TabSecret: tab}) // POST /agent/resume/claim
//	rec, err = m.Revoke(ctx, tid, tokens.Owner{UID: uid, TabSecret: tab})                  // POST /agent/revoke
//
// Two credentials per session: the agent token (the LLM side's bearer for
// LAP) and, from MintTab, the tab secret (the tab's own: it opens the
// WebSocket, and proves an anonymous session's ownership). The LLM side never
// sees the tab secret, so it can neither take over the tab's socket nor
// approve on the human's behalf. A session from Mint has no tab secret; its
// agent token is then also the tab's credential, as in the reference.
//
// A grace window is half-open: a pending-resume record can be re-paired,
// listed and claimed while now < PendingResumeUntil. Verify keeps answering
// ErrRevoked for a revoked token (its hash stays indexed) until the record is
// swept, which Mint does at most once a minute for records whose
// ExpiresAt+Retention has passed.
//
// Stores: MemoryStore (lost on restart) and SQLiteStore (modernc.org/sqlite,
// pure Go; table "tokens", schema version in PRAGMA user_version; it can
// share one database with the confirm and audit tables via
// NewSQLiteStoreDB). Every Store implementation must pass
// tokens/storetest.Run.
//
// A LAP call verifies its bearer, re-reads the record and touches
// LastSeenAt: put a CachedStore in front of a store that does I/O (lapd
// does for SQLite) and those are memory reads, with LastSeenAt written
// behind (Manager.Touch uses a Store's Touch when it has one). The cache's
// doc says what it promises to a store shared by several processes.
package tokens

import (
	"context"
	"errors"
)

// Prefix starts every agent token.
const Prefix = "agt_"

// Status is a token record's lifecycle state. The strings are the wire values.
type Status string

// Statuses, exactly as the reference (LAP v2).
const (
	StatusAwaitingWS     Status = "awaiting-ws"
	StatusAwaitingClaude Status = "awaiting-claude"
	StatusActive         Status = "active"
	StatusPendingResume  Status = "pending-resume"
	StatusRevoked        Status = "revoked"
)

// Record is one token's server-side state. All times are Unix milliseconds, as
// on the wire; zero means "unset" (JSON null).
type Record struct {
	TID                string `json:"tid"`
	TokenHash          string `json:"-"`
	UID                string `json:"uid,omitempty"` // "" = anonymous (null on the wire)
	Status             Status `json:"status"`
	CreatedAt          int64  `json:"createdAt"`
	ExpiresAt          int64  `json:"expiresAt"`
	LastSeenAt         int64  `json:"lastSeenAt"`
	PendingResumeUntil int64  `json:"pendingResumeUntil,omitempty"`
	Origin             string `json:"origin"`
	Label              string `json:"label,omitempty"`
	// TabHash is hex(SHA-256) of the tab secret, the tab's own credential
	// (see MintTab); "" for a session minted without one, whose agent
	// token is then also the tab's credential (the reference's model).
	TabHash string `json:"-"`
	// Used reports that a model has made a LAP call with the current token:
	// set by Activate, cleared when Claim rotates the token. lapd's own (not
	// in the reference's record): a tab that re-pairs before any model used
	// its token is told so (PROTOCOL.md, "active"), so its panel keeps
	// asking the human to paste the line instead of saying an AI is
	// connected.
	Used bool `json:"used,omitempty"`
	// Rev is the store's revision of the write that Update (and so
	// Manager.Connected) returns this record from, in a store that keeps
	// revisions (NATSStore: the KV revision; every later write of the
	// record, by any node, has a higher one); 0 otherwise, and from Get.
	// A cluster orders two nodes' sockets for one tid by it (pairing).
	Rev uint64 `json:"-"`
}

// Errors returned by Store and Manager. Match with errors.Is.
var (
	ErrNotFound  = errors.New("tokens: record not found")
	ErrMalformed = errors.New("tokens: malformed token")             // 401
	ErrUnknown   = errors.New("tokens: unknown token")               // 401
	ErrExpired   = errors.New("tokens: token expired")               // 401 (hard expiry, sliding TTL, or grace passed)
	ErrRevoked   = errors.New("tokens: token revoked")               // 403
	ErrForbidden = errors.New("tokens: not allowed")                 // 403 (ownership/origin/status mismatch on claim/revoke)
	ErrTabSecret = errors.New("tokens: tab secret missing or wrong") // 401 (a WebSocket for a session minted with a tab secret)
	ErrExists    = errors.New("tokens: record already exists")
)

// Store keeps token records. Implementations must be safe for concurrent use.
// Every method takes a context and returns promptly when it is cancelled.
type Store interface {
	// Create inserts a new record; ErrExists if the tid or hash is taken.
	Create(ctx context.Context, rec Record) error
	// Get returns the record for tid, or ErrNotFound.
	Get(ctx context.Context, tid string) (Record, error)
	// FindByHash returns the record whose TokenHash equals hash (hex SHA-256),
	// or ErrNotFound. Implementations compare the stored hash in constant time.
	FindByHash(ctx context.Context, hash string) (Record, error)
	// Update atomically reads the record for tid, calls fn on a copy, and
	// stores the result unless fn returns an error (which Update returns
	// unchanged, leaving the record as it was). ErrNotFound if tid is unknown.
	Update(ctx context.Context, tid string, fn func(*Record) error) (Record, error)
	// ListByUID returns the records owned by uid ("" = anonymous), in
	// creation order.
	ListByUID(ctx context.Context, uid string) ([]Record, error)
	// ListByStatus returns the records in any of statuses, in creation
	// order (used once at start-up; it may scan every record).
	ListByStatus(ctx context.Context, statuses ...Status) ([]Record, error)
	// DeleteExpired removes records whose ExpiresAt is before beforeMs and
	// returns how many went.
	DeleteExpired(ctx context.Context, beforeMs int64) (int, error)
	// Close releases the store's resources.
	Close() error
}
