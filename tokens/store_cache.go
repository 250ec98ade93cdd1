package tokens

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// CachedStore keeps the records it reads in memory in front of another
// Store, so that the LAP hot path (Verify's FindByHash, Get) does no I/O
// and a call writes nothing: LastSeenAt (Touch) is kept in memory and
// written behind, at most once per FlushEvery per record.
//
// What it promises, and why that is enough:
//
//   - Writes go through: Create, Update and DeleteExpired call the next
//     store and then update the cache, so this process always reads its own
//     writes. Update's fn always runs on the next store's current record
//     (inside its transaction), so every state transition — accept, claim,
//     revoke, disconnect — is decided on fresh data, whatever is cached.
//   - Reads may be stale by at most MaxAge (default 1s) for changes made
//     by another process sharing the next store (several lapd on one
//     SQLite file; a NATS KV store on several nodes): a cached record older
//     than MaxAge is read again. So a token revoked elsewhere is refused
//     here within MaxAge. A store that can watch for changes (a KV watch)
//     calls Invalidate to make that immediate.
//   - LastSeenAt written behind: after a crash the stored value may be up
//     to FlushEvery old (it feeds the sliding TTL and the sessions list,
//     which tolerate seconds). Close writes it out.
//   - Memory: a record not used for IdleEvict (default 10 minutes) is
//     forgotten; at most MaxEntries (default 100,000) are kept.
//
// Safe for concurrent use. Close flushes and closes the next store.
type CachedStore struct {
	next Store
	cfg  CacheConfig

	mu     sync.RWMutex
	byTID  map[string]*cacheEntry
	byHash map[string]string // token hash → tid

	wmu     sync.Mutex   // serializes writes through the cache (store call + cache update)
	flushMu sync.Mutex   // held by a flush; Close waits for a timer's flush with it
	wgen    atomic.Int64 // bumped around every write; a read installs its result only if unchanged
	armed   atomic.Bool  // the flush timer is set
	timer   *time.Timer  // guarded by mu
	done    bool         // guarded by mu: closed
}

// CacheConfig configures a CachedStore. Zero values mean the defaults.
type CacheConfig struct {
	MaxAge     time.Duration    // re-read a cached record older than this; default 1s
	FlushEvery time.Duration    // write pending LastSeenAt values this often; default 5s
	IdleEvict  time.Duration    // forget records unused this long; default 10m
	MaxEntries int              // default 100,000
	Clock      func() time.Time // default time.Now
}

// Defaults of CacheConfig.
const (
	DefaultCacheMaxAge     = time.Second
	DefaultCacheFlushEvery = 5 * time.Second
	DefaultCacheIdleEvict  = 10 * time.Minute
	DefaultCacheMaxEntries = 100_000
)

// Toucher is implemented by stores that record LastSeenAt without a write
// per call (CachedStore); Manager.Touch uses it when the store has it.
type Toucher interface {
	// Touch raises tid's LastSeenAt to at (ms); never lowers it.
	Touch(ctx context.Context, tid string, at int64) error
}

type cacheEntry struct {
	rec    Record       // as stored by the next store (replaced whole, under mu)
	loaded int64        // clock ns when rec was read or written
	seen   atomic.Int64 // newest LastSeenAt known here (≥ rec.LastSeenAt)
	used   atomic.Int64 // clock ns of the last read
}

var (
	_ Store   = (*CachedStore)(nil)
	_ Toucher = (*CachedStore)(nil)
)

// NewCachedStore returns a cache in front of next; it owns next (Close
// closes it).
func NewCachedStore(next Store, cfg CacheConfig) *CachedStore {
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultCacheMaxAge
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = DefaultCacheFlushEvery
	}
	if cfg.IdleEvict <= 0 {
		cfg.IdleEvict = DefaultCacheIdleEvict
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultCacheMaxEntries
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &CachedStore{next: next, cfg: cfg, byTID: map[string]*cacheEntry{}, byHash: map[string]string{}}
}

func (c *CachedStore) now() int64 { return c.cfg.Clock().UnixNano() }

// view returns e's record with the newest LastSeenAt known here.
func (e *cacheEntry) view() Record {
	r := e.rec
	if s := e.seen.Load(); s > r.LastSeenAt {
		r.LastSeenAt = s
	}
	return r
}

// lookup returns a fresh cached record by tid or hash.
func (c *CachedStore) lookup(tid, hash string) (Record, bool) {
	now := c.now()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if hash != "" {
		tid = c.byHash[hash]
	}
	e := c.byTID[tid]
	if e == nil || now-e.loaded > c.cfg.MaxAge.Nanoseconds() {
		return Record{}, false
	}
	e.used.Store(now)
	return e.view(), true
}

// install caches rec (read from or written to the next store at loaded).
// Caller holds c.mu.
func (c *CachedStore) installLocked(rec Record, loaded int64) {
	e := c.byTID[rec.TID]
	if e == nil {
		if len(c.byTID) >= c.cfg.MaxEntries {
			c.evictOneLocked()
		}
		e = &cacheEntry{}
		c.byTID[rec.TID] = e
	} else if e.rec.TokenHash != rec.TokenHash {
		delete(c.byHash, e.rec.TokenHash)
	}
	e.rec, e.loaded = rec, loaded
	e.used.Store(loaded)
	for {
		s := e.seen.Load()
		if s >= rec.LastSeenAt || e.seen.CompareAndSwap(s, rec.LastSeenAt) {
			break
		}
	}
	c.byHash[rec.TokenHash] = rec.TID
	c.armLocked()
}

func (c *CachedStore) dropLocked(tid string) {
	if e := c.byTID[tid]; e != nil {
		delete(c.byHash, e.rec.TokenHash)
		delete(c.byTID, tid)
	}
}

// evictOneLocked forgets one clean record (map order: arbitrary).
func (c *CachedStore) evictOneLocked() {
	for tid, e := range c.byTID {
		if e.seen.Load() <= e.rec.LastSeenAt {
			c.dropLocked(tid)
			return
		}
	}
}

// read reads through to the next store and caches the result unless a
// write happened meanwhile (then the next read reads again).
func (c *CachedStore) read(ctx context.Context, get func() (Record, error), tid, hash string) (Record, error) {
	gen := c.wgen.Load()
	loaded := c.now()
	rec, err := get()
	c.mu.Lock()
	defer c.mu.Unlock()
	if errors.Is(err, ErrNotFound) {
		if hash != "" {
			if t, ok := c.byHash[hash]; ok {
				c.dropLocked(t)
			}
		} else {
			c.dropLocked(tid)
		}
		return rec, err
	}
	if err != nil {
		return rec, err
	}
	if gen == c.wgen.Load() && !c.done {
		c.installLocked(rec, loaded)
		return c.byTID[rec.TID].view(), nil
	}
	return rec, nil
}

// Get returns tid's record, from memory when it is fresh.
func (c *CachedStore) Get(ctx context.Context, tid string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	if rec, ok := c.lookup(tid, ""); ok {
		return rec, nil
	}
	return c.read(ctx, func() (Record, error) { return c.next.Get(ctx, tid) }, tid, "")
}

// FindByHash returns the record whose token hash is hash, from memory when
// it is fresh.
func (c *CachedStore) FindByHash(ctx context.Context, hash string) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	if rec, ok := c.lookup("", hash); ok && rec.TokenHash == hash {
		return rec, nil
	}
	return c.read(ctx, func() (Record, error) { return c.next.FindByHash(ctx, hash) }, "", hash)
}

// write runs one write through the next store with the cache locked out
// of stale reads, then applies after to the cache.
func (c *CachedStore) write(op func() error, after func()) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.wgen.Add(1)
	defer c.wgen.Add(1)
	err := op()
	c.mu.Lock()
	after()
	c.mu.Unlock()
	return err
}

// Create inserts rec in the next store and caches it.
func (c *CachedStore) Create(ctx context.Context, rec Record) error {
	var err error
	_ = c.write(func() error { err = c.next.Create(ctx, rec); return err }, func() {
		if err == nil && !c.done {
			c.installLocked(rec, c.now())
		}
	})
	return err
}

// Update runs fn on the next store's current record (with any LastSeenAt
// kept here merged in) and caches the result.
func (c *CachedStore) Update(ctx context.Context, tid string, fn func(*Record) error) (Record, error) {
	var rec Record
	var err, fnErr error
	var wrote int64
	_ = c.write(func() error {
		c.mu.RLock()
		var seen int64
		if e := c.byTID[tid]; e != nil {
			seen = e.seen.Load()
		}
		c.mu.RUnlock()
		rec, err = c.next.Update(ctx, tid, func(r *Record) error {
			if seen > r.LastSeenAt {
				r.LastSeenAt = seen
			}
			fnErr = fn(r)
			return fnErr
		})
		wrote = c.now()
		return err
	}, func() {
		switch {
		case c.done:
		case err == nil || (fnErr != nil && err == fnErr && rec.TID == tid):
			// Written, or fn refused: either way rec is the stored record.
			c.installLocked(rec, wrote)
		default:
			c.dropLocked(tid)
		}
	})
	if err == nil {
		c.mu.RLock()
		if e := c.byTID[tid]; e != nil {
			rec = e.view()
		}
		c.mu.RUnlock()
	}
	return rec, err
}

// ListByUID reads through (it is not on the hot path), with the LastSeenAt
// values kept here.
func (c *CachedStore) ListByUID(ctx context.Context, uid string) ([]Record, error) {
	recs, err := c.next.ListByUID(ctx, uid)
	return c.withSeen(recs), err
}

// ListByStatus reads through (start-up only), with the LastSeenAt values
// kept here.
func (c *CachedStore) ListByStatus(ctx context.Context, statuses ...Status) ([]Record, error) {
	recs, err := c.next.ListByStatus(ctx, statuses...)
	return c.withSeen(recs), err
}

// withSeen raises each record's LastSeenAt to the value kept here.
func (c *CachedStore) withSeen(recs []Record) []Record {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range recs {
		if e := c.byTID[recs[i].TID]; e != nil {
			if s := e.seen.Load(); s > recs[i].LastSeenAt {
				recs[i].LastSeenAt = s
			}
		}
	}
	return recs
}

// DeleteExpired deletes in the next store and forgets the same records.
func (c *CachedStore) DeleteExpired(ctx context.Context, beforeMs int64) (int, error) {
	var n int
	var err error
	_ = c.write(func() error { n, err = c.next.DeleteExpired(ctx, beforeMs); return err }, func() {
		for tid, e := range c.byTID {
			if e.rec.ExpiresAt < beforeMs {
				c.dropLocked(tid)
			}
		}
	})
	return n, err
}

// Touch raises tid's LastSeenAt in memory; it is written within FlushEvery.
// An uncached tid is read first.
func (c *CachedStore) Touch(ctx context.Context, tid string, at int64) error {
	c.mu.RLock()
	e := c.byTID[tid]
	c.mu.RUnlock()
	if e == nil {
		if _, err := c.Get(ctx, tid); err != nil {
			return err
		}
		c.mu.RLock()
		e = c.byTID[tid]
		c.mu.RUnlock()
		if e == nil { // a write raced the read: write through
			_, err := c.Update(ctx, tid, func(r *Record) error {
				if at > r.LastSeenAt {
					r.LastSeenAt = at
				}
				return nil
			})
			return err
		}
	}
	for {
		s := e.seen.Load()
		if s >= at || e.seen.CompareAndSwap(s, at) {
			break
		}
	}
	if !c.armed.Load() {
		c.mu.Lock()
		c.armLocked()
		c.mu.Unlock()
	}
	return nil
}

// Invalidate forgets tid, so that the next read goes to the next store
// (for stores that learn about changes made elsewhere). A pending
// LastSeenAt of tid is written first.
func (c *CachedStore) Invalidate(ctx context.Context, tid string) {
	c.flushOne(ctx, tid)
	c.mu.Lock()
	c.dropLocked(tid)
	c.mu.Unlock()
}

// armLocked sets the flush timer. Caller holds c.mu (write).
func (c *CachedStore) armLocked() {
	if c.done || c.armed.Load() {
		return
	}
	c.armed.Store(true)
	c.timer = time.AfterFunc(c.cfg.FlushEvery, func() { c.flush(context.Background(), true) })
	// (Close stops the timer and then waits on flushMu for a callback
	// that already started.)
}

// flushOne writes tid's pending LastSeenAt, if any.
func (c *CachedStore) flushOne(ctx context.Context, tid string) {
	c.mu.RLock()
	e := c.byTID[tid]
	var seen int64
	dirty := false
	if e != nil {
		seen = e.seen.Load()
		dirty = seen > e.rec.LastSeenAt
	}
	c.mu.RUnlock()
	if !dirty {
		return
	}
	_, _ = c.Update(ctx, tid, func(r *Record) error {
		if seen > r.LastSeenAt { // (Update has merged it in already)
			r.LastSeenAt = seen
		}
		return nil
	})
}

// flush writes every pending LastSeenAt, forgets idle records and, when
// rearm is set and records are left, sets the timer again.
func (c *CachedStore) flush(ctx context.Context, rearm bool) {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	now := c.now()
	c.mu.Lock()
	c.armed.Store(false)
	var dirty []string
	for tid, e := range c.byTID {
		switch {
		case e.seen.Load() > e.rec.LastSeenAt:
			dirty = append(dirty, tid)
		case now-e.used.Load() > c.cfg.IdleEvict.Nanoseconds():
			c.dropLocked(tid)
		}
	}
	c.mu.Unlock()
	for _, tid := range dirty {
		c.flushOne(ctx, tid)
	}
	if rearm {
		c.mu.Lock()
		if len(c.byTID) > 0 {
			c.armLocked()
		}
		c.mu.Unlock()
	}
}

// Close writes pending LastSeenAt values, stops the timer and closes the
// next store.
func (c *CachedStore) Close() error {
	c.mu.Lock()
	c.done = true // no more timers, no more installs
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
	c.flush(context.Background(), false) // waits for a running timer flush first
	return c.next.Close()
}
