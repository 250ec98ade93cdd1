package audit

import (
	"context"
	"maps"
	"sync"
	"time"
)

// RecordLimited records e like Record while source (a client IP, a tid…)
// has audit budget left for e.Event: Config.LimitBurst entries, then one
// per Config.LimitEvery. Over budget, entries are not written one by one
// but counted: once per Config.Window the source gets one summary entry,
// the same event with the first suppressed entry's tid and detail plus
// {"aggregated": n, "since": ms, "until": ms, "budget": source} — so a
// flood of refusals or tab frames costs a bounded number of writes and
// nothing is dropped silently. Budgets run on Config.Clock, never on e.At
// (which may come from the client).
func (l *Log) RecordLimited(ctx context.Context, source string, e Entry) {
	l.RecordPooled(ctx, source, "", e)
}

// RecordPooled is RecordLimited with a second budget, pool, shared by
// every source that names it (e.g. "client-log" for all tabs' own log
// entries): Config.PoolBurst entries, then one per Config.PoolEvery, per
// event. e is recorded only while both source and pool have budget left;
// otherwise it is counted in pool's tally (whichever budget was out), so
// however many sources flood, the pool costs at most its rate in entries
// plus one summary per Window ({"budget": pool, "aggregated": n, …}).
// pool "" is RecordLimited.
func (l *Log) RecordPooled(ctx context.Context, source, pool string, e Entry) {
	if l == nil {
		return
	}
	now := l.cfg.Clock().UnixMilli()
	if e.At == 0 {
		e.At = now
	}
	if l.lim.allow(now, source, pool, e) {
		l.Record(ctx, e)
	}
}

// limiter is RecordLimited's per source × event budgets and tallies, and
// RecordPooled's per pool × event ones.
type limiter struct {
	log *Log

	mu      sync.Mutex
	m       map[limKey]*limState
	timer   *time.Timer // armed while some tally is pending
	stopped bool
}

type limKey struct {
	source, event string
	pool          bool // source names a pool (RecordPooled)
}

type limState struct {
	burst      float64
	every      float64 // ms per unit of budget
	tokens     float64
	last       int64 // ms of the last refill
	suppressed int64
	since      int64
	sample     Entry // the first suppressed entry of this window
}

// stateLocked returns k's state, refilled up to now. Past MaxSources,
// sources (not pools) share one state per event. Caller holds lm.mu.
func (lm *limiter) stateLocked(k limKey, burst int, every time.Duration, now int64) *limState {
	st := lm.m[k]
	if st == nil {
		if !k.pool && len(lm.m) >= lm.log.cfg.MaxSources {
			k.source = "*" // every further source shares one budget
			st = lm.m[k]
		}
		if st == nil {
			st = &limState{burst: float64(burst), every: max(float64(every)/float64(time.Millisecond), 1e-3), tokens: float64(burst), last: now}
			lm.m[k] = st
		}
	}
	if dt := now - st.last; dt > 0 {
		st.tokens = min(st.tokens+float64(dt)/st.every, st.burst)
		st.last = now
	}
	return st
}

// allow takes one unit of source's budget (and pool's, unless ""); false
// means e was counted instead.
func (lm *limiter) allow(now int64, source, pool string, e Entry) bool {
	cfg := &lm.log.cfg
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if lm.m == nil {
		lm.m = map[limKey]*limState{}
	}
	st := lm.stateLocked(limKey{source: source, event: e.Event}, cfg.LimitBurst, cfg.LimitEvery, now)
	tally := st
	if pool != "" {
		ps := lm.stateLocked(limKey{source: pool, event: e.Event, pool: true}, cfg.PoolBurst, cfg.PoolEvery, now)
		tally = ps
		if st.tokens >= 1 && ps.tokens >= 1 {
			ps.tokens--
			st.tokens--
			lm.armLocked()
			return true
		}
	} else if st.tokens >= 1 {
		st.tokens--
		lm.armLocked()
		return true
	}
	if tally.suppressed == 0 {
		tally.since = now
		tally.sample = e
	}
	tally.suppressed++
	lm.armLocked()
	return false
}

// armLocked makes sure a flush runs within a Window while states exist.
func (lm *limiter) armLocked() {
	if lm.timer == nil && !lm.stopped {
		lm.timer = time.AfterFunc(lm.log.cfg.Window, lm.flush)
	}
}

// flush writes one summary per pending tally and forgets sources whose
// budget is full again.
func (lm *limiter) flush() {
	l := lm.log
	now := l.cfg.Clock().UnixMilli()
	var out []Entry
	lm.mu.Lock()
	lm.timer = nil
	for k, st := range lm.m {
		if st.suppressed > 0 {
			e := st.sample
			d := make(map[string]any, len(e.Detail)+3)
			maps.Copy(d, e.Detail)
			d["budget"] = k.source
			d["aggregated"] = st.suppressed
			d["since"], d["until"] = st.since, now
			e.Detail, e.At = d, now
			out = append(out, e)
			st.suppressed, st.sample = 0, Entry{}
			continue
		}
		// Refilled by now: the next entry would be allowed anyway.
		if float64(now-st.last)/st.every+st.tokens >= st.burst {
			delete(lm.m, k)
		}
	}
	if len(lm.m) > 0 {
		lm.armLocked()
	}
	lm.mu.Unlock()
	for _, e := range out {
		l.Record(context.Background(), e)
	}
}

// stop cancels the flush timer for good (Close flushes what is left).
func (lm *limiter) stop() {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	lm.stopped = true
	if lm.timer != nil {
		lm.timer.Stop()
		lm.timer = nil
	}
}
