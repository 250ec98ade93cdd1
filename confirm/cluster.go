package confirm

import (
	"context"
	"time"

	"github.com/lapd-dev/lapd/internal/storeerr"
)

// A Manager over a SharedStore (several lapd processes, one NATS bucket)
// keeps every approval of the cluster in memory, as it would keep its own:
//
//   - Propose stores the approval; every other node's Manager follows the
//     store and holds it as pending too, with its own expiry timer, so the
//     node the tab pairs with re-delivers it (confirm-sync) and any node
//     can Wait for it.
//   - Resolve (the tab's answer, on the node that holds the tab) and expiry
//     (a timer on every node) settle an approval with compare-and-set in
//     the store: the first answer stored stands, on every node. Only the
//     node whose expiry won calls OnExpire, so the tab is told and the
//     expiry audited once. An answer the store did not take (NATS not
//     answering) stands on this node and is sent again every 2 s until
//     it lands (answerLaterLocked).
//   - An answer for an id this node has not seen proposed is parked for
//     parkTTL (at most MaxParkedPerTID per tid), whether or not an Expect
//     is held here: the proposal may be on its way from the node that
//     called the tab.
//   - Wait and Resolve of an id not seen yet read the store first (the
//     watch may lag the write by a moment).
//   - A deletion (keep window over, revoke) made by one node is followed by
//     all.

// parkTTL bounds how long an early answer waits for its proposal in a
// cluster.
const parkTTL = 30 * time.Second

type parkedAnswer struct {
	tid, id string
	at      time.Time
}

// follow applies a change another process (or this one) made to the
// shared store.
func (m *Manager) follow(p Pending, deleted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || !validID(p.TID) || !validID(p.ConfirmID) {
		return
	}
	id := p.ConfirmID
	if deleted {
		ts := m.tids[p.TID]
		if ts == nil {
			return
		}
		if e := ts.pending[id]; e != nil { // dropped elsewhere (revoke)
			m.stopTimer(e.timer)
			ts.pendingBytes -= pendingSize(e.p)
			m.pendingBytes -= pendingSize(e.p)
			delete(ts.pending, id)
			if len(ts.pending) == 0 {
				ts.pending = nil
			}
			e.pending = false
			e.err = ErrUnknown
			close(e.done)
		} else if e := ts.kept[id]; e != nil {
			m.unkeepLocal(e)
		}
		m.forget(p.TID)
		return
	}
	ts := m.tid(p.TID)
	if ts.kept[id] != nil {
		return
	}
	if r := p.Outcome; r != nil {
		e := ts.pending[id]
		if e != nil {
			m.stopTimer(e.timer)
			m.resolveLocked(ts, e, *r)
		} else {
			e = &entry{key: key{p.TID, id}, p: p, done: make(chan struct{})}
			e.p.Outcome = nil
			m.keepLocked(ts, e, *r, time.UnixMilli(r.ResolvedAt).Add(m.cfg.Keep))
		}
		delete(ts.parked, id)
		return
	}
	if ts.pending[id] != nil {
		return
	}
	e := m.addPending(ts, p)
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	m.applyParkedLocked(ctx, ts, e)
	cancel()
}

// fetchShared reads tid/id from the shared store when this node does not
// hold it and applies it; it reports whether it found it, and the store's
// error when it could not read it.
func (m *Manager) fetchShared(ctx context.Context, tid, id string) (bool, error) {
	m.mu.Lock()
	ts := m.tids[tid]
	known := ts != nil && (ts.pending[id] != nil || ts.kept[id] != nil)
	m.mu.Unlock()
	if known {
		return false, nil
	}
	p, ok, err := m.shared.Get(ctx, tid, id)
	if err != nil || !ok {
		return false, err
	}
	m.follow(p, false)
	return true, nil
}

// settleLocked decides the answer that stands for e: r itself on a single
// node; in a cluster, whichever answer the store took first. won reports
// whether it is r. Caller holds mu.
func (m *Manager) settleLocked(ctx context.Context, e *entry, r Resolution) (Resolution, bool) {
	if r.ResolvedAt == 0 {
		r.ResolvedAt = m.now().UnixMilli()
	}
	if m.shared == nil {
		return r, true
	}
	p := e.p
	p.TID, p.ConfirmID = e.key.tid, e.key.id
	p.Outcome = &r
	stands, won, ok, err := m.shared.Answer(ctx, p)
	if err != nil {
		m.log.Warn("confirm: record the answer in the shared store", "tid", e.key.tid, "confirmId", e.key.id, "err", err)
		if storeerr.Unavailable(err) {
			// This node keeps r; the others learn it when it lands.
			until := m.now().Add(m.cfg.Keep)
			if exp := time.UnixMilli(p.ExpiresAt); exp.After(until) {
				until = exp
			}
			m.answerLaterLocked(p, until)
		}
		return r, true
	}
	if !ok { // not in the store (its write failed, or it was dropped): this node's answer
		return r, true
	}
	return stands, won
}

// answerRetry is how long an answer the shared store did not take waits
// before it is sent again.
const answerRetry = 2 * time.Second

// answerLaterLocked sends p's answer (p.Outcome) to the shared store again
// in answerRetry, and again while the store does not answer, until until
// (the approval's expiry or the keep window, whichever is later), or Close.
// Without it, an answer this node recorded while NATS could not be reached
// (the human's click on the node that holds the tab) would stay on this
// node: a /message or /confirm-result waiting on another node would see the
// approval expire instead. Compare-and-set still decides: if another answer
// was stored first (another node's expiry), that one stands there. Caller
// holds mu.
func (m *Manager) answerLaterLocked(p Pending, until time.Time) {
	if m.closed {
		return
	}
	if m.retries == nil {
		m.retries = make(map[*time.Timer]struct{})
	}
	m.timers.Add(1)
	var t *time.Timer
	t = time.AfterFunc(answerRetry, func() {
		defer m.timers.Done()
		<-m.ready
		m.mu.Lock()
		delete(m.retries, t)
		closed := m.closed
		m.mu.Unlock()
		if closed {
			return
		}
		ctx, cancel := context.WithTimeout(m.stop, storeTimeout)
		_, won, ok, err := m.shared.Answer(ctx, p)
		cancel()
		switch {
		case storeerr.Unavailable(err) && m.now().Before(until):
			m.mu.Lock()
			m.answerLaterLocked(p, until)
			m.mu.Unlock()
		case err != nil:
			m.log.Warn("confirm: gave up recording the answer in the shared store", "tid", p.TID, "confirmId", p.ConfirmID, "err", err)
		case ok && !won:
			m.log.Info("confirm: another answer was stored first", "tid", p.TID, "confirmId", p.ConfirmID)
		}
	})
	m.retries[t] = struct{}{}
}

// parkSharedLocked parks an early answer in a cluster. Caller holds mu.
func (m *Manager) parkSharedLocked(tid, id string, r Resolution) {
	ts := m.tid(tid)
	if _, dup := ts.parked[id]; dup || len(ts.parked) >= MaxParkedPerTID || keptSize(id, r) > m.cfg.KeptBytesPerTID {
		m.unproposed++
		m.forget(tid)
		return
	}
	if ts.parked == nil {
		ts.parked = map[string]Resolution{}
	}
	ts.parked[id] = r
	m.parked.PushBack(parkedAnswer{tid: tid, id: id, at: m.now()})
}

// sweepParkedLocked drops early answers whose proposal never came. Caller
// holds mu.
func (m *Manager) sweepParkedLocked(now time.Time) {
	for f := m.parked.Front(); f != nil; f = m.parked.Front() {
		pa := f.Value.(parkedAnswer)
		if now.Sub(pa.at) < parkTTL {
			return
		}
		m.parked.Remove(f)
		if ts := m.tids[pa.tid]; ts != nil {
			if _, ok := ts.parked[pa.id]; ok {
				delete(ts.parked, pa.id)
				m.unproposed++
				m.forget(pa.tid)
			}
		}
	}
}
