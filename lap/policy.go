package lap

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/schema"
)

// DefaultPolicyCacheBytes is how much compiled hello.policy lapd keeps.
const DefaultPolicyCacheBytes = 64 << 20

// maxConcurrentCompiles bounds the policies compiled at once (each is at most
// schema.MaxPolicyNodes subschemas: a fraction of a second of one core), and
// each session may have a new policy compiled at most compileBurst times,
// then once every compileEvery (a tab sends one hello per connection;
// reconnecting with the same policy compiles nothing).
const (
	maxConcurrentCompiles = 1
	compileBurst          = 4
	compileEvery          = 15 * time.Second
)

var (
	errCompileBusy  = errors.New("lap: policy compile queue busy")
	errCompileQuota = errors.New("lap: this session's policy changed too often")
)

// policyCache compiles each distinct hello.policy once and shares it: tabs
// of one app send the same policy, so it is keyed by the SHA-256 of its
// bytes. Each tid remembers which hello it digested (by the identity of the
// policy bytes, which a new hello replaces), so a digest is computed once per
// hello, not per call. Compiled policies are kept least recently used first
// within a byte budget (schema.Policy.Footprint); one evicted is compiled
// again when next needed. At most maxConcurrentCompiles run at once.
type policyCache struct {
	budget  int
	sem     chan struct{}
	parse   func(json.RawMessage) (*schema.Policy, error) // schema.Parse
	onEvict func(bytes int)                               // a compiled policy was evicted for the budget; nil = nothing

	mu    sync.Mutex
	quota map[string]*rate.Limiter // per tid: compiles it may cause
	tids  map[string]tidPolicy
	byKey map[[32]byte]*policyEntry
	lru   *list.List // of *policyEntry, most recent at the front
	bytes int
	shed  int64 // entries evicted for the budget
}

type tidPolicy struct {
	raw    []byte // the hello's policy bytes (identity only)
	digest [32]byte
}

type policyEntry struct {
	key   [32]byte
	ready chan struct{} // closed once pol/err are set
	pol   *schema.Policy
	err   error
	size  int
	elem  *list.Element // nil while compiling or once evicted
}

func newPolicyCache(budget int) *policyCache {
	if budget <= 0 {
		budget = DefaultPolicyCacheBytes
	}
	return &policyCache{budget: budget, sem: make(chan struct{}, maxConcurrentCompiles), parse: schema.Parse,
		quota: map[string]*rate.Limiter{}, tids: map[string]tidPolicy{}, byKey: map[[32]byte]*policyEntry{}, lru: list.New()}
}

func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// get returns the compiled policy for tid's hello.policy raw (nil when the
// tab sent none), compiling it at most once per distinct policy.
func (pc *policyCache) get(ctx context.Context, tid string, raw []byte) (*schema.Policy, error) {
	pc.mu.Lock()
	t, ok := pc.tids[tid]
	if !ok || !sameBytes(t.raw, raw) {
		pc.mu.Unlock()
		t = tidPolicy{raw: raw, digest: sha256.Sum256(raw)}
		pc.mu.Lock()
		pc.tids[tid] = t
	}
	e := pc.byKey[t.digest]
	if e == nil {
		q := pc.quota[tid]
		if q == nil {
			q = rate.NewLimiter(rate.Every(compileEvery), compileBurst)
			pc.quota[tid] = q
		}
		if !q.Allow() {
			pc.mu.Unlock()
			return nil, errCompileQuota
		}
		e = &policyEntry{key: t.digest, ready: make(chan struct{})}
		pc.byKey[t.digest] = e
		pc.mu.Unlock()
		pc.compile(ctx, e, raw)
		pc.mu.Lock()
	} else if e.elem != nil {
		pc.lru.MoveToFront(e.elem)
	}
	pc.mu.Unlock()
	select {
	case <-e.ready:
		return e.pol, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// compile fills e (the caller created it, so nobody else compiles it).
func (pc *policyCache) compile(ctx context.Context, e *policyEntry, raw []byte) {
	select {
	case pc.sem <- struct{}{}:
	case <-ctx.Done():
		pc.mu.Lock()
		delete(pc.byKey, e.key) // let the next caller try
		pc.mu.Unlock()
		e.err = errCompileBusy
		close(e.ready)
		return
	}
	e.pol, e.err = pc.parse(raw)
	<-pc.sem
	e.size = 256 + e.pol.Footprint()
	pc.mu.Lock()
	e.elem = pc.lru.PushFront(e)
	pc.bytes += e.size
	for pc.bytes > pc.budget && pc.lru.Len() > 1 {
		old := pc.lru.Back().Value.(*policyEntry)
		pc.evictLocked(old)
		pc.shed++
		if pc.onEvict != nil {
			pc.onEvict(old.size)
		}
	}
	pc.mu.Unlock()
	close(e.ready)
}

func (pc *policyCache) evictLocked(e *policyEntry) {
	pc.lru.Remove(e.elem)
	e.elem = nil
	pc.bytes -= e.size
	if pc.byKey[e.key] == e {
		delete(pc.byKey, e.key)
	}
}

// drop forgets tid's hello (its socket closed); the compiled policy stays
// cached for other tabs of the same app.
func (pc *policyCache) drop(tid string) {
	pc.mu.Lock()
	delete(pc.tids, tid)
	delete(pc.quota, tid)
	pc.mu.Unlock()
}

// stats: compiled policies kept, their bytes, and how many were evicted.
func (pc *policyCache) stats() (n, bytes int, shed int64) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.lru.Len(), pc.bytes, pc.shed
}

// policy returns tid's compiled policy: nil when the tab sent none.
func (s *Server) policy(ctx context.Context, tid string) (*schema.Policy, error) {
	h, ok := s.cfg.Registry.Hello(tid)
	raw := trimSpace(h.Policy)
	if !ok || len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	return s.policies.get(ctx, tid, h.Policy)
}
