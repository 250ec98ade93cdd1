// Package confirm keeps pending approvals: an action the LLM proposed that the
// human must approve or reject in the tab. Resolutions are level-triggered
// (kept Keep after they happen, so none is lost between two polls); pending
// approvals are persisted in a Store so they survive a server restart and can
// be re-delivered to a tab that reconnects; one never answered expires after
// Expiry as rejected with reason "timeout".
//
// # Using a Manager
//
// Create one Manager per server with a Store (NewMemoryStore, or a
// SQLiteStore to survive restarts):
//
//	st, _ := confirm.OpenSQLite("lapd-data/lapd.db")
//	m, _ := confirm.New(ctx, confirm.Config{Store: st, OnExpire: pushConfirmExpire})
//	defer m.Close() // also closes st
//
// When the tab answers a /message with pending-confirmation, record it:
//
//	m.Propose(ctx, confirm.Pending{TID: tid, ConfirmID: id, Variant: "clearAll"})
//
// When the tab sends confirm-resolved, record the outcome; every waiter wakes:
//
//	m.Resolve(ctx, tid, id, confirm.Resolution{Status: "confirmed", StateAfter: st})
//
// A /message long-poll or a /confirm-result poll waits, bounded by its ctx:
//
//	r, err := m.Wait(ctx, tid, id) // err: ctx.Err(), ErrUnknown, ErrClosed
//
// # Semantics
//
//   - Level-triggered: a resolution is kept for Keep (default 5 min), so a
//     Wait that starts after the resolution (the "poll gap") still sees it.
//     Any number of waiters may wait on one id; all get the same answer.
//   - First wins: a second Resolve of the same id is ignored.
//   - An outcome is kept only for an id that was proposed: Resolve of an
//     unknown id is dropped and counted (Stats.Unproposed), so a tab cannot
//     fill memory with made-up ids. The one legitimate early answer (the tab
//     proposed, the human clicked, and the confirm-resolved frame overtook
//     the server's Propose) is covered by Expect: while a caller holds an
//     Expect for the tid, an unknown id's resolution is parked (at most
//     MaxParkedPerTID) and applied by the Propose that follows.
//   - An approval not answered within Expiry (default 10 min) resolves as
//     {status:"rejected", reason:"timeout"}, is deleted from the Store, and
//     Config.OnExpire is called, outside every lock, from a timer goroutine
//     (or SetOnExpire sets the hook after New; expiries before that are
//     delivered when it is set).
//   - New loads every approval in the Store and re-arms its timer; one that
//     already expired expires right after New returns.
//   - Bounds, in entries and in bytes: at most MaxPendingPerTID pending
//     approvals and Config.PendingBytesPerTID bytes of them per tid
//     (Propose returns ErrTooManyPending past that), Config.PendingBytes in
//     all. A proposal that would go over the total makes room: the oldest
//     pending approval of the tid holding the most bytes of them is expired
//     as on timeout, with reason too-many-pending (answered, OnExpire
//     called, counted in Stats.PendingShed), again until it fits; only when
//     the proposing tid would itself hold the most is the proposal refused
//     (ErrTooManyPending). Many anonymous tokens of one client can fill the
//     total in a second; without this, every other session's approval was
//     refused until theirs expired. At most MaxKeptPerTID kept resolutions and
//     Config.KeptBytesPerTID bytes of them per tid (that tid's oldest go
//     first), and MaxKept / Config.KeptBytes in all: past those, the oldest
//     resolution of the tid keeping the most bytes goes, never a global FIFO,
//     so one session (or many tokens of one client) cannot evict another's
//     answers. Every resolution dropped this way is counted (Stats.Shed) and
//     logged.
//
// Timers are ordinary time.AfterFunc timers and times are read from
// Config.Clock, so tests drive expiry and keep windows with testing/synctest.
package confirm

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

// ErrUnknown: no pending approval or kept resolution with that id for that tid.
var ErrUnknown = errors.New("confirm: unknown confirmId")

// ErrTooManyPending is returned by Propose when the tid already has
// MaxPendingPerTID approvals pending or Config.PendingBytesPerTID bytes of
// them, or when the total is full and the tid would hold the most.
var ErrTooManyPending = errors.New("confirm: too many pending approvals for this session")

// ReasonTooManyPending is the rejection reason kept for a proposal Propose
// refused with ErrTooManyPending (see Propose).
const ReasonTooManyPending = "too-many-pending"

// ErrClosed is returned by calls on a closed Manager, and by Wait calls that
// were blocked when it closed.
var ErrClosed = errors.New("confirm: manager closed")

// ErrDuplicate is returned by Propose when the confirmId is already pending
// for that tid with another variant or payload. Proposing the same approval
// again is not an error.
var ErrDuplicate = errors.New("confirm: confirmId already pending")

// Bounds of a Manager.
const (
	MaxPendingPerTID = 1000    // pending approvals per tid
	MaxKept          = 10000   // kept resolutions in all
	MaxKeptPerTID    = 1000    // kept resolutions per tid
	MaxParkedPerTID  = 16      // early resolutions waiting for their Propose (see Expect)
	MaxIDLen         = 200     // length of a confirmId or tid
	MaxPayload       = 1 << 20 // bytes of a Pending.Payload
)

// Byte budgets: the defaults of Config's zero values.
const (
	DefaultPendingBytesPerTID = 8 << 20
	DefaultPendingBytes       = 64 << 20
	DefaultKeptBytesPerTID    = 16 << 20
	DefaultKeptBytes          = 64 << 20
)

// Defaults of Config.
const (
	DefaultExpiry = 10 * time.Minute
	DefaultKeep   = 5 * time.Minute
)

// Resolution statuses and reasons.
const (
	StatusConfirmed     = "confirmed"
	StatusRejected      = "rejected"
	ReasonUserCancelled = "user-cancelled"
	ReasonTimeout       = "timeout"
)

// storeTimeout bounds store writes made from timer goroutines.
const storeTimeout = 5 * time.Second

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

	// Outcome is nil while the approval is pending. A Store holds answered
	// approvals too, with their Outcome (ResolvedAt set), for the Keep
	// window: the answer survives a restart like the question does.
	Outcome *Resolution `json:"-"`
}

// Resolution is how an approval ended.
type Resolution struct {
	Status     string          `json:"status"`           // confirmed | rejected
	Reason     string          `json:"reason,omitempty"` // user-cancelled | timeout | too-many-pending (rejected only)
	StateAfter json.RawMessage `json:"stateAfter,omitempty"`
	Variant    string          `json:"-"`
	ResolvedAt int64           `json:"-"`
}

// Store persists approvals: pending ones, and answered ones (Pending.Outcome
// set) for the Keep window. Put inserts or replaces by (TID, ConfirmID).
// Safe for concurrent use.
type Store interface {
	Put(ctx context.Context, p Pending) error
	Delete(ctx context.Context, tid, confirmID string) error
	List(ctx context.Context) ([]Pending, error) // every approval, pending or answered (load at start)
	Close() error
}

// Config configures a Manager. Zero values mean the documented defaults.
type Config struct {
	Store    Store            // nil = memory only
	Expiry   time.Duration    // unanswered approvals expire; default 10m
	Keep     time.Duration    // resolutions kept; default 5m
	Clock    func() time.Time // default time.Now
	OnExpire func(p Pending)  // called (outside locks) when an approval expires (p.Outcome: why); push confirm-expire here
	Logger   *slog.Logger     // store failures in timer goroutines, shedding; nil = discard

	PendingBytesPerTID int // payload bytes of pending approvals per tid; default 8 MiB
	PendingBytes       int // … in all; default 64 MiB
	KeptBytesPerTID    int // bytes of kept resolutions (stateAfter) per tid; default 16 MiB
	KeptBytes          int // … in all; default 64 MiB
}

// Stats are a Manager's gauges and counters (for metrics).
type Stats struct {
	Pending      int   // approvals pending now
	PendingBytes int   // their payload bytes
	Kept         int   // resolutions kept now
	KeptBytes    int   // their bytes
	Shed         int64 // kept resolutions dropped early for a bound, since New
	PendingShed  int64 // pending approvals expired early to make room for another tid's, since New
	Unproposed   int64 // resolutions of ids never proposed, dropped, since New
}

type key struct{ tid, id string }

// entry is one approval, pending or resolved. Fields are guarded by
// Manager.mu; done is closed exactly once, after res/resolved/err are set.
type entry struct {
	key      key
	p        Pending
	pending  bool
	seq      uint64 // proposal order (Manager.seq), breaks ProposedAt ties
	timer    *time.Timer
	done     chan struct{}
	resolved bool
	res      Resolution
	err      error // why done was closed without a resolution
	keepTill time.Time
	gElem    *list.Element // in Manager.kept
	tElem    *list.Element // in tidState.kept
}

type tidState struct {
	pending      map[string]*entry
	kept         map[string]*entry
	order        list.List // kept entries of this tid, oldest first
	pendingBytes int
	keptBytes    int
	expecting    int                   // Expect calls not yet released
	parked       map[string]Resolution // early resolutions (see Expect)
}

// Manager tracks approvals. Safe for concurrent use.
type Manager struct {
	cfg   Config
	log   *slog.Logger
	ready chan struct{} // closed when New returns; timer callbacks wait for it

	mu     sync.Mutex
	closed bool
	tids   map[string]*tidState
	kept   *list.List // every kept resolution, oldest first
	sweep  *time.Timer
	seq    uint64 // proposal order, breaks ProposedAt ties in PendingFor
	timers sync.WaitGroup

	onExpire   func(Pending) // guarded by mu; starts as cfg.OnExpire
	unnotified []Pending     // expiries while onExpire was nil (bounded)

	pendingBytes, keptBytes int       // guarded by mu
	shed, unproposed        int64     // guarded by mu
	pendingShed             int64     // guarded by mu
	lastPendingShedLog      time.Time // guarded by mu
	lastShedLog             time.Time // guarded by mu

	// shared is Config.Store when other processes share it (a cluster):
	// see SharedStore and cluster.go.
	shared  SharedStore
	parked  *list.List               // of parkedAnswer, oldest first (shared stores only)
	retries map[*time.Timer]struct{} // answers waiting to be sent to the shared store again (guarded by mu)
	stop    context.Context          // cancelled by Close: ends a store call made from a timer
	cancel  context.CancelFunc
}

// maxUnnotified bounds the expiries kept for a hook set later.
const maxUnnotified = 10000

// New loads the store's pending approvals and starts their expiry timers.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Expiry <= 0 {
		cfg.Expiry = DefaultExpiry
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.PendingBytesPerTID, DefaultPendingBytesPerTID)
	def(&cfg.PendingBytes, DefaultPendingBytes)
	def(&cfg.KeptBytesPerTID, DefaultKeptBytesPerTID)
	def(&cfg.KeptBytes, DefaultKeptBytes)
	m := &Manager{
		cfg:   cfg,
		log:   cfg.Logger,
		ready: make(chan struct{}),
		tids:  make(map[string]*tidState),
		kept:  list.New(),

		onExpire: cfg.OnExpire,
		parked:   list.New(),
	}
	m.stop, m.cancel = context.WithCancel(context.Background())
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	defer close(m.ready)
	if cfg.Store == nil {
		return m, nil
	}
	if sh, ok := cfg.Store.(SharedStore); ok {
		// Follow first: a change made while the list loads is applied
		// after it (both are idempotent), never lost between the two.
		m.shared = sh
		sh.Follow(m.follow)
	}
	ps, err := cfg.Store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("confirm: load pending approvals: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range ps {
		ts := m.tid(p.TID)
		if _, dup := ts.pending[p.ConfirmID]; dup {
			continue
		}
		if _, dup := ts.kept[p.ConfirmID]; dup {
			continue
		}
		if r := p.Outcome; r != nil {
			// An answer from before the restart: kept for what is left of
			// its window (and within the budgets), like any other.
			if m.now().Sub(time.UnixMilli(r.ResolvedAt)) >= m.cfg.Keep {
				m.storeDelete(p.TID, p.ConfirmID)
				m.forget(p.TID)
				continue
			}
			e := &entry{key: key{p.TID, p.ConfirmID}, p: p, done: make(chan struct{})}
			e.p.Outcome = nil
			m.keepLocked(ts, e, *r, time.UnixMilli(r.ResolvedAt).Add(m.cfg.Keep))
			continue
		}
		m.addPending(ts, p)
	}
	return m, nil
}

// storeDelete removes an approval from the Store (from timer and shedding
// paths, without a caller's ctx). Caller holds mu.
func (m *Manager) storeDelete(tid, id string) {
	if m.cfg.Store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := m.cfg.Store.Delete(ctx, tid, id); err != nil {
		m.log.Warn("confirm: delete approval from store", "tid", tid, "confirmId", id, "err", err)
	}
}

// storeResolved records e's answer in the Store. Caller holds mu.
func (m *Manager) storeResolved(ctx context.Context, e *entry, r Resolution) {
	if m.cfg.Store == nil || m.shared != nil { // a shared store has it from settleLocked
		return
	}
	p := e.p
	p.TID, p.ConfirmID = e.key.tid, e.key.id
	p.Outcome = &r
	// The payload is the question, not the answer: nothing reads it once
	// answered, and keeping it on disk for Keep would let approvals expired
	// to make room (see Propose) hold disk past the pending budget.
	p.Payload, p.Reason = nil, ""
	if err := m.cfg.Store.Put(ctx, p); err != nil {
		m.log.Warn("confirm: record the answer in the store", "tid", e.key.tid, "confirmId", e.key.id, "err", err)
	}
}

func (m *Manager) now() time.Time { return m.cfg.Clock() }

// tid returns tid's state, creating it. Caller holds mu.
func (m *Manager) tid(tid string) *tidState {
	ts := m.tids[tid]
	if ts == nil {
		// Maps are made when first written: most states live from an
		// Expect to its release (one per /message) and hold nothing.
		ts = new(tidState)
		m.tids[tid] = ts
	}
	return ts
}

// forget removes tid's state once it holds nothing. Caller holds mu.
func (m *Manager) forget(tid string) {
	if ts := m.tids[tid]; ts != nil && len(ts.pending) == 0 && len(ts.kept) == 0 && ts.expecting == 0 && len(ts.parked) == 0 {
		delete(m.tids, tid)
	}
}

// refuseLocked keeps a refused proposal's answer, rejected with reason
// "too-many-pending", for the Keep window: the tab was told to take the
// approval back, so a retried /message (same idempotency key, so the same
// confirmId from the tab's memory) must read that answer, not record an
// approval nobody can see and wait for it until expiry. In memory only:
// after a restart a retry is refused or recorded afresh. Caller holds mu.
func (m *Manager) refuseLocked(ts *tidState, p Pending) {
	now := m.now()
	e := &entry{key: key{p.TID, p.ConfirmID}, p: p, done: make(chan struct{})}
	m.keepLocked(ts, e, Resolution{Status: "rejected", Reason: ReasonTooManyPending, Variant: p.Variant, ResolvedAt: now.UnixMilli()}, now.Add(m.cfg.Keep))
}

// addPending indexes p and arms its expiry timer. Caller holds mu.
func (m *Manager) addPending(ts *tidState, p Pending) *entry {
	e := &entry{key: key{p.TID, p.ConfirmID}, p: p, pending: true, done: make(chan struct{})}
	if ts.pending == nil {
		ts.pending = make(map[string]*entry)
	}
	ts.pending[p.ConfirmID] = e
	ts.pendingBytes += pendingSize(p)
	m.pendingBytes += pendingSize(p)
	m.seq++
	e.seq = m.seq
	d := time.UnixMilli(p.ExpiresAt).Sub(m.now())
	m.timers.Add(1)
	e.timer = time.AfterFunc(max(d, 0), func() { m.expire(e) })
	return e
}

// stopTimer stops t, accounting for the timer WaitGroup. Caller holds mu.
func (m *Manager) stopTimer(t *time.Timer) {
	if t != nil && t.Stop() {
		m.timers.Done()
	}
}

func validID(s string) bool { return s != "" && len(s) <= MaxIDLen }

// What one approval holds in memory besides its strings: the entry, its
// timer and done channel, the list elements, the map slots, and its
// session's state when it is the session's only one (the worst case, and
// the one many anonymous sessions make). Measured, not guessed
// (TestSizesCoverTheHeap: ~1,050 and ~1,200 B on amd64 with one per
// session, ~670 and ~840 with a hundred); with 128, the byte budgets held
// 4–6× the memory they were set to.
const (
	pendingOverhead = 1152
	keptOverhead    = 1344
)

// pendingSize is what a pending approval costs in bytes (about).
func pendingSize(p Pending) int {
	return len(p.Payload) + len(p.ConfirmID) + len(p.Variant) + len(p.Intent) + len(p.Reason) + pendingOverhead
}

// keptSize is what a kept resolution costs in bytes (about).
func keptSize(id string, r Resolution) int {
	return len(r.StateAfter) + len(id) + len(r.Variant) + len(r.Reason) + keptOverhead
}

// Propose records a pending approval (ProposedAt/ExpiresAt filled if zero).
// If the id was already resolved (the human answered before the proposal was
// recorded), Propose does nothing and returns nil: Wait returns that answer.
// Proposing an approval that is already pending with the same variant and
// payload does nothing (a retried /message whose tab answered with the same
// confirmId). If it would take the total over PendingBytes, Propose first
// expires the oldest approvals of the tid holding the most (see the package
// doc; OnExpire is called for them before Propose returns).
//
// It returns ErrDuplicate if the id is pending for another variant or
// payload; ErrTooManyPending past MaxPendingPerTID or PendingBytesPerTID, or
// past PendingBytes when this tid would hold the most (and then keeps the id
// answered rejected with reason too-many-pending, so proposing it again
// returns nil and Wait that answer); and the Store's error if persisting
// fails. Then nothing is recorded (an answer parked for the id stays parked
// for a retry; nothing was expired to make room) and the caller should take
// the approval back from the tab; storeerr.Unavailable tells a store that
// did not answer (retry in a few seconds) from one that refused.
func (m *Manager) Propose(ctx context.Context, p Pending) error {
	expired, hook, err := m.propose(ctx, p)
	for _, x := range expired {
		hook(x)
	}
	return err
}

// propose is Propose; it returns the approvals it expired to make room and
// the hook to tell (called by Propose outside the lock).
func (m *Manager) propose(ctx context.Context, p Pending) ([]Pending, func(Pending), error) {
	if !validID(p.TID) || !validID(p.ConfirmID) {
		return nil, nil, fmt.Errorf("confirm: tid and confirmId must be 1..%d bytes", MaxIDLen)
	}
	if len(p.Payload) > MaxPayload {
		return nil, nil, fmt.Errorf("confirm: payload of %d bytes is over the %d byte limit", len(p.Payload), MaxPayload)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, ErrClosed
	}
	m.sweepLocked()
	now := m.now()
	if p.ProposedAt == 0 {
		p.ProposedAt = now.UnixMilli()
	}
	if p.ExpiresAt == 0 {
		p.ExpiresAt = now.Add(m.cfg.Expiry).UnixMilli()
	}
	ts := m.tid(p.TID)
	if e, ok := ts.pending[p.ConfirmID]; ok {
		if e.p.Variant == p.Variant && bytes.Equal(e.p.Payload, p.Payload) {
			return nil, nil, nil // the same proposal again (a retried /message)
		}
		return nil, nil, ErrDuplicate
	}
	if _, ok := ts.kept[p.ConfirmID]; ok {
		return nil, nil, nil
	}
	if len(ts.pending) >= MaxPendingPerTID {
		m.refuseLocked(ts, p)
		return nil, nil, fmt.Errorf("%w (limit %d)", ErrTooManyPending, MaxPendingPerTID)
	}
	n := pendingSize(p)
	if ts.pendingBytes+n > m.cfg.PendingBytesPerTID {
		m.refuseLocked(ts, p)
		return nil, nil, fmt.Errorf("%w (their payloads are over the session's %d bytes)", ErrTooManyPending, m.cfg.PendingBytesPerTID)
	}
	victims, ok := m.planRoomLocked(ts, n)
	if !ok {
		m.refuseLocked(ts, p)
		return nil, nil, fmt.Errorf("%w (lapd's %d bytes of pending approvals are in use, and this session holds the most)", ErrTooManyPending, m.cfg.PendingBytes)
	}
	if m.cfg.Store != nil {
		if err := m.cfg.Store.Put(ctx, p); err != nil {
			m.forget(p.TID)
			return nil, nil, fmt.Errorf("confirm: persist approval: %w", err)
		}
	}
	var expired []Pending
	for _, v := range victims {
		if x, won := m.expireLocked(v, ReasonTooManyPending); won {
			expired = append(expired, x)
		}
	}
	if len(victims) > 0 {
		m.pendingShed += int64(len(victims))
		if now.Sub(m.lastPendingShedLog) > 10*time.Second {
			m.lastPendingShedLog = now
			m.log.Warn("confirm: pending approvals over budget; expired the oldest of the heaviest sessions to make room",
				"expired", len(victims), "expired_total", m.pendingShed, "pending_bytes", m.pendingBytes, "for_tid", p.TID)
		}
	}
	// The expired approvals' answers are kept, which may have shed this
	// tid's last kept answer and forgotten its state: look it up again.
	ts = m.tid(p.TID)
	e := m.addPending(ts, p)
	m.applyParkedLocked(ctx, ts, e)
	return m.notifyLocked(expired), m.onExpire, nil
}

// planRoomLocked lists the pending approvals to expire so that n more bytes
// of ts fit in Config.PendingBytes: the oldest of the tid holding the most
// bytes of pending approvals, again and again (a plan, so that nothing is
// expired for a proposal that is refused, or that the Store then refuses).
// ok is false when ts, with n more, would hold more than every other tid:
// then its proposal is the one refused. Caller holds mu.
func (m *Manager) planRoomLocked(ts *tidState, n int) (victims []*entry, ok bool) {
	need := m.pendingBytes + n - m.cfg.PendingBytes
	if need <= 0 {
		return nil, true
	}
	left := map[*tidState]int{}       // bytes each tid would still hold
	queue := map[*tidState][]*entry{} // its approvals not planned yet, oldest first
	for need > 0 {
		var heavy *tidState
		hb := 0
		for _, o := range m.tids {
			if o == ts || len(o.pending) == 0 {
				continue
			}
			b, planned := left[o]
			if !planned {
				b = o.pendingBytes
			} else if len(queue[o]) == 0 {
				continue
			}
			if heavy == nil || b > hb {
				heavy, hb = o, b
			}
		}
		if heavy == nil || ts.pendingBytes+n > hb {
			return nil, false
		}
		q, planned := queue[heavy]
		if !planned {
			q = m.oldestFirstLocked(heavy)
		}
		e := q[0]
		queue[heavy] = q[1:]
		left[heavy] = hb - pendingSize(e.p)
		need -= pendingSize(e.p)
		victims = append(victims, e)
	}
	return victims, true
}

// oldestFirstLocked lists ts's pending approvals, oldest first. Caller
// holds mu.
func (m *Manager) oldestFirstLocked(ts *tidState) []*entry {
	es := make([]*entry, 0, len(ts.pending))
	for _, e := range ts.pending {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b *entry) int {
		if a.p.ProposedAt != b.p.ProposedAt {
			return cmpInt(a.p.ProposedAt, b.p.ProposedAt)
		}
		return cmpInt(a.seq, b.seq)
	})
	return es
}

// applyParkedLocked resolves e with an answer parked for it (the human
// answered before the proposal was recorded). Caller holds mu.
func (m *Manager) applyParkedLocked(ctx context.Context, ts *tidState, e *entry) {
	r, ok := ts.parked[e.key.id]
	if !ok {
		return
	}
	delete(ts.parked, e.key.id)
	m.stopTimer(e.timer)
	if r.Variant == "" {
		r.Variant = e.p.Variant
	}
	r, _ = m.settleLocked(ctx, e, r)
	m.resolveLocked(ts, e, r)
	if ts.kept[e.key.id] == e {
		m.storeResolved(ctx, e, e.res)
	}
}

// Expect tells the Manager that a Propose for tid may follow (the tab was
// asked to dispatch and may answer with a proposal): until release is
// called, a Resolve of an id not yet proposed for tid is parked instead of
// dropped, and the Propose applies it. Call release once, after the Propose
// (or when none will come); parked resolutions left then are dropped.
func (m *Manager) Expect(tid string) (release func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || !validID(tid) {
		return func() {}
	}
	m.tid(tid).expecting++
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			ts := m.tids[tid]
			if ts == nil {
				return
			}
			if ts.expecting--; ts.expecting == 0 && m.shared == nil { // shared: parked answers age out instead
				m.unproposed += int64(len(ts.parked))
				ts.parked = nil
				m.forget(tid)
			}
		})
	}
}

// Resolve records the outcome for tid/confirmID and wakes its waiters. It
// returns the pending entry and true if it was pending; a second resolution
// of the same id is ignored (first wins). The outcome of an id that was
// never proposed is not kept (it is parked while an Expect is held, see
// Expect); Resolve then returns false.
func (m *Manager) Resolve(ctx context.Context, tid, confirmID string, r Resolution) (Pending, bool) {
	if !validID(tid) || !validID(confirmID) {
		return Pending{}, false
	}
	if m.shared != nil {
		_, _ = m.fetchShared(ctx, tid, confirmID) // not read: parked below, the watch brings it
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Pending{}, false
	}
	m.sweepLocked()
	ts := m.tids[tid]
	if ts == nil || (ts.pending[confirmID] == nil && ts.kept[confirmID] == nil) {
		if m.shared != nil {
			// Another node may be recording the proposal right now.
			m.parkSharedLocked(tid, confirmID, r)
			return Pending{}, false
		}
		// Never proposed: keep nothing, unless a proposal may be on its way.
		if ts != nil && ts.expecting > 0 && len(ts.parked) < MaxParkedPerTID && keptSize(confirmID, r) <= m.cfg.KeptBytesPerTID {
			if _, dup := ts.parked[confirmID]; !dup {
				if ts.parked == nil {
					ts.parked = map[string]Resolution{}
				}
				ts.parked[confirmID] = r
			}
			return Pending{}, false
		}
		m.unproposed++
		return Pending{}, false
	}
	if _, ok := ts.kept[confirmID]; ok {
		return Pending{}, false
	}
	e, wasPending := ts.pending[confirmID]
	if wasPending {
		m.stopTimer(e.timer)
		if r.Variant == "" {
			r.Variant = e.p.Variant
		}
	}
	r, won := m.settleLocked(ctx, e, r)
	m.resolveLocked(ts, e, r)
	wasPending = wasPending && won
	if e.resolved && ts.kept[confirmID] == e {
		m.storeResolved(ctx, e, e.res)
	}
	return e.p, wasPending
}

// resolveLocked moves e from pending to kept with r and wakes its waiters.
// Caller holds mu and has stopped e's timer and updated the store.
func (m *Manager) resolveLocked(ts *tidState, e *entry, r Resolution) {
	now := m.now()
	if r.ResolvedAt == 0 {
		r.ResolvedAt = now.UnixMilli()
	}
	if e.pending {
		ts.pendingBytes -= pendingSize(e.p)
		m.pendingBytes -= pendingSize(e.p)
	}
	delete(ts.pending, e.key.id)
	if len(ts.pending) == 0 {
		ts.pending = nil // a map does not shrink: an emptied one kept its room
	}
	e.pending = false
	m.keepLocked(ts, e, r, now.Add(m.cfg.Keep))
}

// keepLocked records r as e's answer, keeps it until keepTill (within the
// budgets) and wakes e's waiters. Caller holds mu.
func (m *Manager) keepLocked(ts *tidState, e *entry, r Resolution, keepTill time.Time) {
	now := m.now()
	e.resolved = true
	e.res = r
	e.keepTill = keepTill
	close(e.done)

	n := keptSize(e.key.id, r)
	if ts.kept == nil {
		ts.kept = make(map[string]*entry)
	}
	ts.kept[e.key.id] = e
	ts.keptBytes += n
	m.keptBytes += n
	e.tElem = ts.order.PushBack(e)
	e.gElem = m.kept.PushBack(e)
	shed := 0
	for ts.order.Len() > 1 && (ts.order.Len() > MaxKeptPerTID || ts.keptBytes > m.cfg.KeptBytesPerTID) {
		m.unkeep(ts.order.Front().Value.(*entry))
		shed++
	}
	byCount := false
	for m.kept.Len() > MaxKept || m.keptBytes > m.cfg.KeptBytes {
		heavy := m.heaviestLocked()
		if heavy == nil {
			break
		}
		byCount = byCount || m.kept.Len() > MaxKept
		m.unkeep(heavy.order.Front().Value.(*entry))
		shed++
	}
	if shed > 0 {
		m.shed += int64(shed)
		if now.Sub(m.lastShedLog) > 10*time.Second {
			m.lastShedLog = now
			// Say which bound: the count is fixed, only the bytes follow
			// --max-kept-mib, so raising it does not help a count.
			limit := "their byte budget (a share of --max-kept-mib)"
			if byCount {
				limit = fmt.Sprintf("the %d answers lapd keeps in all (fixed; --max-kept-mib does not raise it)", MaxKept)
			}
			m.log.Warn("confirm: approvals' answers over "+limit+"; dropped the oldest of the sessions keeping the most",
				"dropped", shed, "dropped_total", m.shed, "kept", m.kept.Len(), "kept_bytes", m.keptBytes)
		}
	}
	m.armSweep()
}

// heaviestLocked returns the tid state keeping the most bytes of
// resolutions (by count on a tie). Caller holds mu.
func (m *Manager) heaviestLocked() *tidState {
	var heavy *tidState
	for _, ts := range m.tids {
		if ts.order.Len() == 0 {
			continue
		}
		if heavy == nil || ts.keptBytes > heavy.keptBytes || (ts.keptBytes == heavy.keptBytes && ts.order.Len() > heavy.order.Len()) {
			heavy = ts
		}
	}
	return heavy
}

// unkeep forgets a kept resolution (here and in the Store). Caller holds mu.
func (m *Manager) unkeep(e *entry) {
	m.storeDelete(e.key.tid, e.key.id)
	m.unkeepLocal(e)
}

// unkeepLocal forgets a kept resolution here only. Caller holds mu.
func (m *Manager) unkeepLocal(e *entry) {
	ts := m.tids[e.key.tid]
	m.kept.Remove(e.gElem)
	n := keptSize(e.key.id, e.res)
	m.keptBytes -= n
	if ts != nil {
		ts.keptBytes -= n
		ts.order.Remove(e.tElem)
		delete(ts.kept, e.key.id)
		if len(ts.kept) == 0 {
			ts.kept = nil
		}
		m.forget(e.key.tid)
	}
}

// Stats returns the Manager's gauges and counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Stats{PendingBytes: m.pendingBytes, Kept: m.kept.Len(), KeptBytes: m.keptBytes, Shed: m.shed, PendingShed: m.pendingShed, Unproposed: m.unproposed}
	for _, ts := range m.tids {
		st.Pending += len(ts.pending)
	}
	return st
}

// sweepLocked drops kept resolutions past their keep window. Caller holds mu.
func (m *Manager) sweepLocked() {
	now := m.now()
	m.sweepParkedLocked(now)
	for f := m.kept.Front(); f != nil; f = m.kept.Front() {
		e := f.Value.(*entry)
		if now.Before(e.keepTill) {
			return
		}
		m.unkeep(e)
	}
}

// armSweep makes sure a timer will sweep the oldest kept resolution. Caller
// holds mu.
func (m *Manager) armSweep() {
	if m.sweep != nil || m.kept.Len() == 0 || m.closed {
		return
	}
	d := m.kept.Front().Value.(*entry).keepTill.Sub(m.now())
	m.timers.Add(1)
	var t *time.Timer
	t = time.AfterFunc(max(d, 0), func() {
		defer m.timers.Done()
		<-m.ready
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.sweep != t {
			return
		}
		m.sweep = nil
		m.sweepLocked()
		m.armSweep()
	})
	m.sweep = t
}

// expire is e's timer callback.
func (m *Manager) expire(e *entry) {
	defer m.timers.Done()
	<-m.ready
	m.mu.Lock()
	ts := m.tids[e.key.tid]
	if m.closed || !e.pending || ts == nil || ts.pending[e.key.id] != e {
		m.mu.Unlock()
		return
	}
	p, won := m.expireLocked(e, ReasonTimeout)
	if !won { // another node answered (or expired) it first: its hook ran there
		m.mu.Unlock()
		return
	}
	ps, hook := m.notifyLocked([]Pending{p}), m.onExpire
	m.mu.Unlock()
	for _, p := range ps {
		hook(p)
	}
}

// expireLocked rejects pending e with reason (timeout, or too-many-pending
// when expired to make room): the answer is settled (in a cluster, the
// first one stored stands), kept and stored, and e's waiters wake with it.
// It returns e with that answer in Outcome, and whether this answer won
// (then OnExpire is due, see notifyLocked). Caller holds mu.
func (m *Manager) expireLocked(e *entry, reason string) (Pending, bool) {
	ts := m.tids[e.key.tid]
	m.stopTimer(e.timer)
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	r, won := m.settleLocked(ctx, e, Resolution{Status: StatusRejected, Reason: reason, Variant: e.p.Variant})
	m.resolveLocked(ts, e, r)
	if ts.kept[e.key.id] == e {
		m.storeResolved(ctx, e, e.res)
	}
	p := e.p
	res := e.res
	p.Outcome = &res
	return p, won
}

// notifyLocked returns the expiries to pass to the hook now, or, while no
// hook is set, keeps them for SetOnExpire (at most maxUnnotified, newest
// kept) and returns none. Caller holds mu.
func (m *Manager) notifyLocked(ps []Pending) []Pending {
	if m.onExpire != nil || len(ps) == 0 {
		return ps
	}
	m.unnotified = append(m.unnotified, ps...)
	if over := len(m.unnotified) - maxUnnotified; over > 0 {
		m.unnotified = slices.Delete(m.unnotified, 0, over)
	}
	return nil
}

// SetOnExpire sets (or replaces) the expiry hook, for a caller that can only
// build it after New (the hook needs a server that needs the Manager).
// Expiries that happened while no hook was set (at most 10,000, newest kept)
// are passed to f now, in order, on the calling goroutine. Prefer this to a
// late-bound closure in Config.OnExpire: approvals loaded already expired
// expire right after New returns.
func (m *Manager) SetOnExpire(f func(Pending)) {
	m.mu.Lock()
	m.onExpire = f
	var late []Pending
	if f != nil {
		late, m.unnotified = m.unnotified, nil
	}
	m.mu.Unlock()
	for _, p := range late {
		f(p)
	}
}

// Wait blocks until tid/confirmID is resolved (returning at once if it
// already was, within Keep) or ctx is done (ctx.Err()). ErrUnknown if the id
// is neither pending nor resolved, or if it is dropped while waiting;
// ErrClosed if the Manager closes while waiting. On a shared store (a
// cluster), an id this node does not hold is read from the store: if the
// store did not answer (storeerr.Unavailable: NATS electing a leader or
// unreachable) while ctx still ran, Wait returns that error, wrapped, rather
// than ErrUnknown: the id may well exist, and the caller should retry.
func (m *Manager) Wait(ctx context.Context, tid, confirmID string) (Resolution, error) {
	return m.wait(ctx, tid, confirmID, m.shared != nil)
}

func (m *Manager) wait(ctx context.Context, tid, confirmID string, fetch bool) (Resolution, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return Resolution{}, ErrClosed
	}
	m.sweepLocked()
	ts := m.tids[tid]
	var e *entry
	if ts != nil {
		if e = ts.kept[confirmID]; e == nil {
			e = ts.pending[confirmID]
		}
	}
	m.mu.Unlock()
	if e == nil && fetch {
		found, err := m.fetchShared(ctx, tid, confirmID)
		if found {
			return m.wait(ctx, tid, confirmID, false)
		}
		if storeerr.Unavailable(err) && ctx.Err() == nil {
			return Resolution{}, fmt.Errorf("confirm: read approval %s from the shared store: %w", confirmID, err)
		}
	}
	if e == nil {
		return Resolution{}, ErrUnknown
	}
	select {
	case <-e.done: // an answer already there wins over a ctx already done
		if e.resolved {
			return e.res, nil
		}
		return Resolution{}, e.err
	default:
	}
	select {
	case <-e.done:
		if e.resolved {
			return e.res, nil
		}
		return Resolution{}, e.err
	case <-ctx.Done():
		return Resolution{}, ctx.Err()
	}
}

// PendingFor lists tid's pending approvals, oldest first.
func (m *Manager) PendingFor(tid string) []Pending {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := m.tids[tid]
	if ts == nil || len(ts.pending) == 0 {
		return nil
	}
	es := m.oldestFirstLocked(ts)
	out := make([]Pending, len(es))
	for i, e := range es {
		out[i] = e.p
	}
	return out
}

func cmpInt[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Drop forgets everything about tid (revoke): its pending approvals are
// removed from the Store without a resolution, its kept resolutions are
// forgotten, and its waiters return ErrUnknown. OnExpire is not called.
func (m *Manager) Drop(ctx context.Context, tid string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := m.tids[tid]
	if ts == nil {
		return
	}
	for id, e := range ts.pending {
		m.stopTimer(e.timer)
		m.pendingBytes -= pendingSize(e.p)
		e.pending = false
		e.err = ErrUnknown
		close(e.done)
		if m.cfg.Store != nil {
			if err := m.cfg.Store.Delete(ctx, tid, id); err != nil {
				m.log.Warn("confirm: delete dropped approval from store", "tid", tid, "confirmId", id, "err", err)
			}
		}
	}
	for id, e := range ts.kept {
		m.kept.Remove(e.gElem)
		if m.cfg.Store != nil {
			if err := m.cfg.Store.Delete(ctx, tid, id); err != nil {
				m.log.Warn("confirm: delete dropped answer from store", "tid", tid, "confirmId", id, "err", err)
			}
		}
	}
	m.keptBytes -= ts.keptBytes
	delete(m.tids, tid)
}

// Close stops timers, wakes every waiter with ErrClosed, waits for timer
// callbacks that already started, and closes the store. Pending approvals
// and kept answers stay in the Store for the next New. Close is idempotent.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.cancel()
	m.stopTimer(m.sweep)
	m.sweep = nil
	for t := range m.retries {
		m.stopTimer(t)
	}
	m.retries = nil
	for _, ts := range m.tids {
		for _, e := range ts.pending {
			m.stopTimer(e.timer)
			e.err = ErrClosed
			close(e.done)
		}
	}
	m.tids = make(map[string]*tidState)
	m.kept.Init()
	m.pendingBytes, m.keptBytes = 0, 0
	m.mu.Unlock()
	m.timers.Wait()
	if m.cfg.Store != nil {
		return m.cfg.Store.Close()
	}
	return nil
}
