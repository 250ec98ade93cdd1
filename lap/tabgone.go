package lap

import (
	"context"
	"sync"
)

// tabGone tells an approval wait that the tab's socket closed. The
// reference ends its confirm waits at once when the socket goes ("confirm
// waits resolve as timeout": /message answers pending-confirmation,
// /confirm-result still-pending); without this a /message waited out its
// whole approval timeout for a tab that was gone. Only the waiting call
// ends: the approval stays pending, is re-delivered to the tab when it
// re-pairs (confirm-sync), and /confirm-result reads its answer later.
//
// A call holds its tid's entry from its gate (before the admit), so a
// close at any later point, even before the wait starts, ends it. A tab
// paired here keeps its tid's entry until its socket closes (no allocation
// per call); for another tid (in a cluster, a tab held by another node) an
// entry lives while a call holds it. A close cancels the entry and removes
// it; the next pairing or call makes a new one.
type tabGone struct {
	mu sync.Mutex
	m  map[string]*goneEntry
}

type goneEntry struct {
	ctx    context.Context
	cancel context.CancelFunc
	refs   int
	paired bool // a socket of the tid paired here: kept until it closes
}

// entryLocked returns tid's entry, made if there is none. g.mu held.
func (g *tabGone) entryLocked(tid string) *goneEntry {
	if g.m == nil {
		g.m = map[string]*goneEntry{}
	}
	e := g.m[tid]
	if e == nil {
		e = &goneEntry{}
		e.ctx, e.cancel = context.WithCancel(context.Background())
		g.m[tid] = e
	}
	return e
}

// paired keeps tid's entry while its socket, paired here, is open.
func (g *tabGone) paired(tid string) {
	g.mu.Lock()
	g.entryLocked(tid).paired = true
	g.mu.Unlock()
}

// hold returns a context cancelled when tid's socket closes, and the
// release the caller must call once it no longer waits.
func (g *tabGone) hold(tid string) (context.Context, func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entryLocked(tid)
	e.refs++
	return e.ctx, func() {
		g.mu.Lock()
		e.refs--
		if e.refs == 0 && !e.paired && g.m[tid] == e {
			delete(g.m, tid)
			e.cancel() // nobody holds it: release the context's resources
		}
		g.mu.Unlock()
	}
}

// closed ends the waits of tid's current holders.
func (g *tabGone) closed(tid string) {
	g.mu.Lock()
	e := g.m[tid]
	delete(g.m, tid)
	g.mu.Unlock()
	if e != nil {
		e.cancel()
	}
}

// len is how many tids have an entry (tests).
func (g *tabGone) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.m)
}

// skewSet remembers sessions whose tab lapd refused for its LAP version
// (hello.lapVersion < 2, closed 4426): their 503 paused says to update the
// app's client instead of "retry", which never helps. A tid leaves the set
// when a tab of it pairs. Bounded: past maxSkew an arbitrary tid is
// forgotten (its paused detail is then the generic one).
type skewSet struct {
	mu sync.Mutex
	m  map[string]struct{}
}

const maxSkew = 4096

func (k *skewSet) add(tid string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]struct{}{}
	}
	if _, ok := k.m[tid]; !ok && len(k.m) >= maxSkew {
		for t := range k.m {
			delete(k.m, t)
			break
		}
	}
	k.m[tid] = struct{}{}
}

func (k *skewSet) del(tid string) {
	k.mu.Lock()
	delete(k.m, tid)
	k.mu.Unlock()
}

func (k *skewSet) has(tid string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.m[tid]
	return ok
}

// onTabPaired and onTabClosed are the pairing hooks around onPaired and
// onClosed (hooks.go).
func (s *Server) onTabPaired(tid string, repair bool) {
	s.skew.del(tid)
	s.tabGone.paired(tid)
	s.onPaired(tid, repair)
}

func (s *Server) onTabClosed(tid string) {
	s.tabGone.closed(tid)
	s.onClosed(tid)
}
