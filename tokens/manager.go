package tokens

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for the zero values of Config.
const (
	DefaultTTL       = 24 * time.Hour
	DefaultGrace     = 60 * time.Second
	DefaultRetention = time.Hour
	// sweepInterval bounds how often Mint sweeps dead records.
	sweepInterval = time.Minute
	// MaxResumeTIDs bounds how many tids one ResumeList call looks up; the
	// rest are ignored.
	MaxResumeTIDs = 100
)

// Config configures a Manager. Zero values mean the documented defaults.
type Config struct {
	Store      Store            // required
	TTL        time.Duration    // hard expiry from mint/claim; default 24h
	SlidingTTL time.Duration    // 0 = off: when set, LastSeenAt+SlidingTTL < now fails verification (ErrExpired)
	Grace      time.Duration    // pending-resume grace; default 60s; negative = 0 (already expired at close)
	Retention  time.Duration    // dead records are swept once ExpiresAt+Retention has passed; default 1h
	Clock      func() time.Time // default time.Now
	Logger     *slog.Logger     // reports failed lazy sweeps; nil = discard
}

// TouchResolution is the precision of LastSeenAt: Touch skips the write
// when the record was touched less than this long ago.
const TouchResolution = time.Second

// Manager implements the token lifecycle over a Store. Safe for concurrent use.
type Manager struct {
	cfg       Config
	lastSweep atomic.Int64 // Unix ms of the last sweep attempt
	// touchDown holds, by tid, the Unix ms of a touch write the store did
	// not take (it did not answer: Unavailable); none is tried again for
	// TouchResolution. Without it, every call of a tab paid the store's
	// timeout while the store could not write (JetStream without a quorum:
	// +0.5 s a call).
	touchDown sync.Map
}

// NewManager returns a Manager; it errors if cfg.Store is nil.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Store == nil {
		return nil, errors.New("tokens: Config.Store is required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	switch {
	case cfg.Grace == 0:
		cfg.Grace = DefaultGrace
	case cfg.Grace < 0:
		cfg.Grace = 0
	}
	if cfg.SlidingTTL < 0 {
		cfg.SlidingTTL = 0
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg}, nil
}

// errUnchanged tells Store.Update to keep the record as it is; the manager
// turns it into a successful "nothing to do".
var errUnchanged = errors.New("tokens: unchanged")

// update wraps Store.Update so that fn may return errUnchanged to skip the write.
func (m *Manager) update(ctx context.Context, tid string, fn func(*Record) error) (Record, bool, error) {
	rec, err := m.cfg.Store.Update(ctx, tid, fn)
	if errors.Is(err, errUnchanged) {
		return rec, false, nil
	}
	return rec, err == nil, err
}

// insideGrace reports whether a pending-resume record can still be resumed
// at now: strictly before PendingResumeUntil (a zero grace is already over).
func insideGrace(rec Record, now int64) bool {
	return rec.Status == StatusPendingResume && now < rec.PendingResumeUntil
}

// Mint creates an awaiting-ws record for uid ("" = anonymous) minted from
// origin and returns the plaintext token (shown once) and the record. It also
// sweeps dead records lazily, at most once a minute.
func (m *Manager) Mint(ctx context.Context, uid, origin, label string) (string, Record, error) {
	return m.mint(ctx, uid, origin, label, "")
}

// MintTab is Mint plus a tab secret: the tab's own credential, returned in
// plaintext once and stored hashed. The session's WebSocket then opens only
// with it (AcceptTab), so the agent token, which the LLM side holds, no
// longer opens the tab's side; and it proves an anonymous session's
// ownership for Claim and Revoke.
func (m *Manager) MintTab(ctx context.Context, uid, origin, label string) (token, tabSecret string, rec Record, err error) {
	tabSecret, tabHash := GenerateTabSecret()
	token, rec, err = m.mint(ctx, uid, origin, label, tabHash)
	if err != nil {
		return "", "", Record{}, err
	}
	return token, tabSecret, rec, nil
}

func (m *Manager) mint(ctx context.Context, uid, origin, label, tabHash string) (string, Record, error) {
	now := m.Now()
	m.maybeSweep(ctx, now)
	token, hash := Generate()
	rec := Record{
		TID:        newTID(),
		TokenHash:  hash,
		UID:        uid,
		Status:     StatusAwaitingWS,
		CreatedAt:  now,
		ExpiresAt:  now + m.cfg.TTL.Milliseconds(),
		LastSeenAt: now,
		Origin:     origin,
		Label:      label,
		TabHash:    tabHash,
	}
	if err := m.cfg.Store.Create(ctx, rec); err != nil {
		return "", Record{}, fmt.Errorf("tokens: mint: %w", err)
	}
	return token, rec, nil
}

func (m *Manager) maybeSweep(ctx context.Context, now int64) {
	last := m.lastSweep.Load()
	if last != 0 && now-last < sweepInterval.Milliseconds() {
		return
	}
	if !m.lastSweep.CompareAndSwap(last, now) {
		return // another Mint is sweeping
	}
	if _, err := m.Sweep(ctx); err != nil {
		m.cfg.Logger.Warn("tokens: sweeping dead records failed", "err", err)
	}
}

// Sweep deletes the records whose ExpiresAt+Retention has passed and reports
// how many went. Mint calls it lazily; call it yourself to sweep on a timer.
func (m *Manager) Sweep(ctx context.Context) (int, error) {
	return m.cfg.Store.DeleteExpired(ctx, m.Now()-m.cfg.Retention.Milliseconds())
}

// Verify checks a bearer for a LAP call: ErrMalformed/ErrUnknown/ErrExpired
// (hard expiry or sliding TTL) → 401, ErrRevoked → 403. A pending-resume record
// past its grace still verifies (the caller answers 503 paused/expired).
// With ErrRevoked and ErrExpired the record is returned too, for auditing.
func (m *Manager) Verify(ctx context.Context, token string) (Record, error) {
	hash, err := Hash(token)
	if err != nil {
		return Record{}, err
	}
	rec, err := m.cfg.Store.FindByHash(ctx, hash)
	switch {
	case errors.Is(err, ErrNotFound):
		return Record{}, ErrUnknown
	case err != nil:
		return Record{}, err
	}
	return rec, m.check(rec, m.Now())
}

// check applies the status and expiry rules of Verify to a found record.
func (m *Manager) check(rec Record, now int64) error {
	switch {
	case rec.Status == StatusRevoked:
		return ErrRevoked
	case rec.ExpiresAt <= now:
		return ErrExpired
	case m.cfg.SlidingTTL > 0 && rec.LastSeenAt+m.cfg.SlidingTTL.Milliseconds() < now:
		return ErrExpired
	}
	return nil
}

// Accept is AcceptTab without a tab secret: it opens only a session minted
// without one.
func (m *Manager) Accept(ctx context.Context, token string) (rec Record, repair bool, err error) {
	return m.AcceptTab(ctx, token, "")
}

// AcceptTab is CheckAcceptTab and Connected in one step, for callers that
// have no upgrade that could fail in between.
func (m *Manager) AcceptTab(ctx context.Context, token, tabSecret string) (rec Record, repair bool, err error) {
	found, err := m.CheckAcceptTab(ctx, token, tabSecret)
	if err != nil {
		return found, false, err
	}
	return m.Connected(ctx, found.TID, found.TokenHash, tabSecret)
}

// CheckAcceptTab is called before a WebSocket upgrade and changes nothing.
// It verifies the token (the errors of Verify) and the tab secret
// (ErrTabSecret when the session has one and tabSecret is not it, or
// tabSecret is given for a session without one), and refuses a
// pending-resume record past its grace (ErrExpired). The upgrade may still
// fail; only Connected, once the socket is up, moves the record.
// rec.TabHash != "" tells the caller the socket proves the tab secret.
func (m *Manager) CheckAcceptTab(ctx context.Context, token, tabSecret string) (Record, error) {
	rec, err := m.Verify(ctx, token)
	if err != nil {
		return rec, err
	}
	if !tabOK(rec, tabSecret) {
		return rec, ErrTabSecret
	}
	if rec.Status == StatusPendingResume && !insideGrace(rec, m.Now()) {
		return rec, ErrExpired
	}
	return rec, nil
}

// Connected records that a socket for tid, opened with the token whose hash
// is tokenHash (and tabSecret), is now up: the record moves to
// awaiting-claude (or back to active when it was pending-resume inside its
// grace: repair=true). The record is checked again first (revoked, expired,
// claimed with new credentials meanwhile: the error of CheckAcceptTab, and
// the socket must be closed).
func (m *Manager) Connected(ctx context.Context, tid, tokenHash, tabSecret string) (rec Record, repair bool, err error) {
	rec, err = m.cfg.Store.Update(ctx, tid, func(r *Record) error {
		now := m.Now()
		if r.TokenHash != tokenHash {
			return ErrUnknown
		}
		if !tabOK(*r, tabSecret) {
			return ErrTabSecret
		}
		if err := m.check(*r, now); err != nil {
			return err
		}
		r.LastSeenAt = now
		if r.Status == StatusPendingResume {
			if !insideGrace(*r, now) {
				return ErrExpired
			}
			r.Status = StatusActive
			r.PendingResumeUntil = 0
			if r.Label == "" {
				r.Label = repairLabel
			}
			repair = true
			return nil
		}
		// awaiting-ws, awaiting-claude, or a second socket while active: the
		// next LAP call activates it (as the reference does).
		r.Status = StatusAwaitingClaude
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		return Record{}, false, ErrUnknown
	}
	if err != nil {
		return rec, false, err
	}
	return rec, repair, nil
}

// Activate records a model's LAP call: awaiting-claude → active with label
// uid ?? label ?? "Claude" (the reference's activation), and Used set. An
// active record not yet Used (a tab that re-paired before any model used
// its token: the reference makes that active too) gets Used, and the label
// "(reconnected)" such a re-pair gave it becomes uid ?? "Claude". It
// reports whether it changed anything (the caller then pushes
// {t:'active'}).
func (m *Manager) Activate(ctx context.Context, tid string) (Record, bool, error) {
	return m.update(ctx, tid, func(r *Record) error {
		switch {
		case r.Status == StatusAwaitingClaude:
			r.Status = StatusActive
		case r.Status == StatusActive && !r.Used:
			if r.Label == repairLabel {
				r.Label = ""
			}
		default:
			return errUnchanged
		}
		r.Used = true
		switch {
		case r.UID != "":
			r.Label = r.UID
		case r.Label == "":
			r.Label = "Claude"
		}
		return nil
	})
}

// repairLabel is the label a re-pair gives a record that had none.
const repairLabel = "(reconnected)"

// Disconnected moves active/awaiting-claude → pending-resume with the grace
// deadline. Other statuses are left alone.
func (m *Manager) Disconnected(ctx context.Context, tid string) (Record, error) {
	rec, _, err := m.update(ctx, tid, func(r *Record) error {
		if r.Status != StatusActive && r.Status != StatusAwaitingClaude {
			return errUnchanged
		}
		r.Status = StatusPendingResume
		r.PendingResumeUntil = m.Now() + m.cfg.Grace.Milliseconds()
		return nil
	})
	return rec, err
}

// Touch sets LastSeenAt = now (to within TouchResolution).
func (m *Manager) Touch(ctx context.Context, tid string) error {
	// LastSeenAt only needs TouchResolution precision (it feeds the sliding
	// TTL and the sessions list), so a record touched within that window is
	// not written again: on the LAP hot path this turns a write transaction
	// per call into a read.
	now := m.Now()
	if t, ok := m.cfg.Store.(Toucher); ok {
		return t.Touch(ctx, tid, now)
	}
	if rec, err := m.cfg.Store.Get(ctx, tid); err == nil && now-rec.LastSeenAt < TouchResolution.Milliseconds() && now >= rec.LastSeenAt {
		return nil
	}
	if v, ok := m.touchDown.Load(tid); ok {
		if at := v.(int64); now-at < TouchResolution.Milliseconds() && now >= at {
			return nil
		}
	}
	_, err := m.cfg.Store.Update(ctx, tid, func(r *Record) error {
		r.LastSeenAt = now
		return nil
	})
	switch {
	case err == nil:
		m.touchDown.Delete(tid)
	case Unavailable(err):
		m.touchDown.Store(tid, now)
	}
	return err
}

// Get returns the record for tid.
func (m *Manager) Get(ctx context.Context, tid string) (Record, error) {
	return m.cfg.Store.Get(ctx, tid)
}

// ResumeList returns uid's records among tids that are pending-resume inside
// their grace window; a missing label reads "(unknown)". Only the first
// MaxResumeTIDs tids are looked up; unknown tids are skipped.
func (m *Manager) ResumeList(ctx context.Context, uid string, tids []string) ([]Record, error) {
	if len(tids) > MaxResumeTIDs {
		tids = tids[:MaxResumeTIDs]
	}
	now := m.Now()
	out := []Record{}
	for _, tid := range tids {
		rec, err := m.cfg.Store.Get(ctx, tid)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if rec.UID != uid || !insideGrace(rec, now) || rec.ExpiresAt <= now {
			continue
		}
		if rec.Label == "" {
			rec.Label = "(unknown)"
		}
		out = append(out, rec)
	}
	return out, nil
}

// Owner is who acts on a session in Claim and Revoke: the uid that the host
// app's identity names ("" = anonymous) and, for an anonymous session, proof
// that the caller holds it. A uid is proof enough for the uid's own sessions;
// an anonymous session, owned by nobody in particular, needs its tab secret
// (or, for a session minted without one, its current agent token): knowing a
// tid, which appears in logs and audit, is not enough.
type Owner struct {
	UID       string
	TabSecret string // the session's tab secret (MintTab)
	Token     string // the session's current agent token
}

// owns reports whether by may act on r. For a claim of a session minted
// with a tab secret only that secret counts as proof: the agent token is in
// the LLM side's hands, and a claim hands out a new tab secret.
func (by Owner) owns(r Record, claim bool) bool {
	if r.UID != by.UID {
		return false
	}
	if r.UID != "" {
		return true
	}
	if matchHash(by.TabSecret, r.TabHash, HashTabSecret) {
		return true
	}
	if claim && r.TabHash != "" {
		return false
	}
	return matchHash(by.Token, r.TokenHash, Hash)
}

// tabOK reports whether a socket presenting tabSecret may open r: the
// session's tab secret if it has one, none if it has none.
func tabOK(r Record, tabSecret string) bool {
	if r.TabHash == "" {
		return tabSecret == ""
	}
	return matchHash(tabSecret, r.TabHash, HashTabSecret)
}

// Claim rotates the token of a pending-resume record that by owns and that
// was minted from origin, inside its grace window and before hard expiry
// (unlike the reference), and makes it active with a fresh TTL. A session
// minted with a tab secret gets a new one too (returned; "" otherwise).
// ErrForbidden otherwise.
func (m *Manager) Claim(ctx context.Context, tid, origin string, by Owner) (token, tabSecret string, rec Record, err error) {
	token, hash := Generate()
	newTab, newTabHash := GenerateTabSecret()
	rec, err = m.cfg.Store.Update(ctx, tid, func(r *Record) error {
		now := m.Now()
		if !by.owns(*r, true) || r.Origin != origin || !insideGrace(*r, now) || r.ExpiresAt <= now {
			return ErrForbidden
		}
		r.TokenHash = hash
		if r.TabHash != "" {
			r.TabHash = newTabHash
		}
		r.Status = StatusActive
		r.Used = false // a new token: no model has it yet
		r.PendingResumeUntil = 0
		r.ExpiresAt = now + m.cfg.TTL.Milliseconds()
		r.LastSeenAt = now
		if r.Label == "" {
			r.Label = "(resumed)"
		}
		return nil
	})
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrForbidden):
		return "", "", Record{}, ErrForbidden
	case err != nil:
		return "", "", Record{}, fmt.Errorf("tokens: claim: %w", err)
	}
	if rec.TabHash == "" {
		newTab = ""
	}
	return token, newTab, rec, nil
}

// Revoke makes the record revoked (terminal). ErrForbidden if unknown or not
// by's (see Owner). Revoking twice is not an error. The token hash stays
// indexed, so the revoked bearer reads ErrRevoked (403) until the record is
// swept.
func (m *Manager) Revoke(ctx context.Context, tid string, by Owner) (Record, error) {
	return m.revoke(ctx, tid, func(r Record) bool { return by.owns(r, false) })
}

// RevokeAny revokes tid whoever owns it: the host app's own admin action.
// ErrForbidden if tid is unknown.
func (m *Manager) RevokeAny(ctx context.Context, tid string) (Record, error) {
	return m.revoke(ctx, tid, func(Record) bool { return true })
}

func (m *Manager) revoke(ctx context.Context, tid string, allowed func(Record) bool) (Record, error) {
	rec, _, err := m.update(ctx, tid, func(r *Record) error {
		if !allowed(*r) {
			return ErrForbidden
		}
		if r.Status == StatusRevoked {
			return errUnchanged
		}
		r.Status = StatusRevoked
		r.PendingResumeUntil = 0
		return nil
	})
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrForbidden):
		return Record{}, ErrForbidden
	case err != nil:
		return Record{}, fmt.Errorf("tokens: revoke: %w", err)
	}
	return rec, nil
}

// AfterRestart is called once at start-up, before serving. A record that
// was active or awaiting-claude had a socket in the previous process; after a
// crash (kill -9, power loss) nobody moved it to pending-resume, so the LLM
// would hear "reconnect pending" until the token's TTL. AfterRestart moves
// each one to pending-resume with a fresh grace from now: its tab re-pairs
// inside the grace as after any drop, and LAP answers expired after it. It
// returns how many records moved. Run one lapd serve per store.
func (m *Manager) AfterRestart(ctx context.Context) (int, error) {
	recs, err := m.cfg.Store.ListByStatus(ctx, StatusActive, StatusAwaitingClaude)
	if err != nil {
		return 0, fmt.Errorf("tokens: after restart: %w", err)
	}
	n := 0
	for _, rec := range recs {
		if _, err := m.Disconnected(ctx, rec.TID); err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return n, fmt.Errorf("tokens: after restart: %w", err)
		}
		n++
	}
	return n, nil
}

// Sessions lists uid's active and pending-resume records ("" uid → none),
// oldest first.
func (m *Manager) Sessions(ctx context.Context, uid string) ([]Record, error) {
	out := []Record{}
	if uid == "" {
		return out, nil
	}
	recs, err := m.cfg.Store.ListByUID(ctx, uid)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		if rec.Status == StatusActive || rec.Status == StatusPendingResume {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Now returns the manager's clock reading in Unix ms.
func (m *Manager) Now() int64 { return m.cfg.Clock().UnixMilli() }
