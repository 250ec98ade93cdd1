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
// nothing is dropped silently.
func (l *Log) RecordLimited(ctx context.Context, source string, e Entry) {
	if l == nil {
		return
	}
	if e.At == 0 {
		e.At = l.cfg.Clock().UnixMilli()
	}
	if l.lim.allow(source, e) {
		l.Record(ctx, e)
	}
}

// limiter is RecordLimited's per source × event budgets and tallies.
type limiter struct {
	log *Log

	mu      sync.Mutex
	m       map[limKey]*limState
	timer   *time.Timer // armed while some tally is pending
	stopped bool
}

type limKey struct{ source, event string }

type limState struct {
	tokens     float64
	last       int64 // ms of the last refill
	suppressed int64
	since      int64
	sample     Entry // the first suppressed entry of this window
}

// allow takes one unit of budget; false means e was counted instead.
func (lm *limiter) allow(source string, e Entry) bool {
	cfg := &lm.log.cfg
	now := e.At
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if lm.m == nil {
		lm.m = map[limKey]*limState{}
	}
	k := limKey{source, e.Event}
	st := lm.m[k]
	if st == nil {
		if len(lm.m) >= cfg.MaxSources {
			k.source = "*" // every further source shares one budget
			if st = lm.m[k]; st == nil {
				st = &limState{tokens: float64(cfg.LimitBurst), last: now}
				lm.m[k] = st
			}
		} else {
			st = &limState{tokens: float64(cfg.LimitBurst), last: now}
			lm.m[k] = st
		}
	}
	if dt := now - st.last; dt > 0 {
		st.tokens += float64(dt) / float64(cfg.LimitEvery.Milliseconds())
		if st.tokens > float64(cfg.LimitBurst) {
			st.tokens = float64(cfg.LimitBurst)
		}
		st.last = now
	}
	if st.tokens >= 1 {
		st.tokens--
		lm.armLocked()
		return true
	}
	if st.suppressed == 0 {
		st.since = now
		st.sample = e
	}
	st.suppressed++
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
		if float64(now-st.last)/float64(l.cfg.LimitEvery.Milliseconds())+st.tokens >= float64(l.cfg.LimitBurst) {
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
