package lap

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// MaxIdempotencyKeyLen caps a /message idempotencyKey.
const MaxIdempotencyKeyLen = 200

// idempotency remembers /message outcomes by (tid, key) for ttl. A repeat
// while the first is running waits for it. At most maxKeys keys per tid; at
// most maxTIDs tids.
type idempotency struct {
	ttl       time.Duration
	maxKeys   int // per tid
	maxTotal  int // over all tids
	clock     func() time.Time
	mu        sync.Mutex
	m         map[string]map[string]*idemEntry
	total     int
	lastSweep time.Time
}

// MaxIdempotencyEntries caps remembered /message outcomes over all sessions.
const MaxIdempotencyEntries = 50_000

type idemEntry struct {
	done    chan struct{}
	body    any // the 200 response; nil if the first call failed (then the key is forgotten)
	expires time.Time
}

func newIdempotency(ttl time.Duration, maxKeys int, clock func() time.Time) *idempotency {
	return &idempotency{ttl: ttl, maxKeys: maxKeys, maxTotal: MaxIdempotencyEntries, clock: clock, m: map[string]map[string]*idemEntry{}}
}

var errIdemFull = errf(http.StatusTooManyRequests, CodeRateLimited, "too many idempotency keys in flight for this session")

// do runs fn once per (tid, key) within ttl; repeats get the first 200 body.
// An error outcome is not remembered: the next repeat runs fn again.
func (im *idempotency) do(ctx context.Context, tid, key string, fn func() (any, *apiError)) (any, *apiError) {
	for {
		now := im.clock()
		im.mu.Lock()
		if now.Sub(im.lastSweep) > im.ttl || im.total >= im.maxTotal {
			im.lastSweep = now
			im.sweepLocked(now)
		}
		keys := im.m[tid]
		if keys == nil {
			keys = map[string]*idemEntry{}
			im.m[tid] = keys
		}
		e := keys[key]
		if e != nil && e.body != nil && now.After(e.expires) {
			delete(keys, key)
			im.total--
			e = nil
		}
		if e == nil {
			if (len(keys) >= im.maxKeys || im.total >= im.maxTotal) && !im.evictLocked(keys, now) {
				im.mu.Unlock()
				return nil, errIdemFull
			}
			e = &idemEntry{done: make(chan struct{})}
			keys[key] = e
			im.total++
			im.mu.Unlock()
			return im.run(tid, key, e, fn)
		}
		im.mu.Unlock()
		select {
		case <-e.done:
			if e.body != nil {
				return e.body, nil
			}
			// the first failed and forgot the key: try again
		case <-ctx.Done():
			return nil, errf(http.StatusGatewayTimeout, CodeTimeout, "request cancelled while an identical request was running")
		}
	}
}

func (im *idempotency) run(tid, key string, e *idemEntry, fn func() (any, *apiError)) (body any, ae *apiError) {
	defer func() {
		im.mu.Lock()
		if ae == nil {
			e.body = body
			e.expires = im.clock().Add(im.ttl)
		} else if keys := im.m[tid]; keys != nil && keys[key] == e {
			delete(keys, key)
			im.total--
		}
		close(e.done)
		im.mu.Unlock()
	}()
	return fn()
}

// evictLocked drops expired entries of keys, else the oldest finished one.
func (im *idempotency) evictLocked(keys map[string]*idemEntry, now time.Time) bool {
	var oldest string
	var oldestAt time.Time
	freed := false
	for k, e := range keys {
		if e.body == nil {
			continue // in flight
		}
		if now.After(e.expires) {
			delete(keys, k)
			im.total--
			freed = true
			continue
		}
		if oldest == "" || e.expires.Before(oldestAt) {
			oldest, oldestAt = k, e.expires
		}
	}
	if !freed && oldest != "" {
		delete(keys, oldest)
		im.total--
		freed = true
	}
	return freed
}

func (im *idempotency) sweepLocked(now time.Time) {
	for tid, keys := range im.m {
		for k, e := range keys {
			if e.body != nil && now.After(e.expires) {
				delete(keys, k)
				im.total--
			}
		}
		if len(keys) == 0 {
			delete(im.m, tid)
		}
	}
}

// drop forgets tid (revoke).
func (im *idempotency) drop(tid string) {
	im.mu.Lock()
	im.total -= len(im.m[tid])
	delete(im.m, tid)
	im.mu.Unlock()
}
