package lap

import (
	"container/list"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/lapd-dev/lapd/internal/clientip"
)

// DefaultMaxRateKeys caps how many keys a limiter tracks at once. A key
// costs about 250 bytes with its string (TestLimiterKeyCost), so a full
// limiter about 25 MB; lap has two (LAP calls, mints).
const DefaultMaxRateKeys = 100_000

// limiter is a set of token buckets keyed by a string (tid, uid or client
// IP), in least-recently-used order. A bucket idle long enough to be full
// again is forgotten (that changes nothing). Over maxKeys the least recently
// used bucket is evicted to make room: a new key is never refused for want of
// room, so a flood of distinct keys cannot lock everyone else out. The most a
// flood buys is a fresh bucket for a key it pushed out, and pushing one out
// takes maxKeys requests from distinct keys after that key's last request.
type limiter struct {
	limit   rate.Limit
	burst   int
	maxKeys int
	clock   func() time.Time

	mu      sync.Mutex
	m       map[string]*list.Element // of *bucket
	lru     *list.List               // front = most recently used
	evicted atomic.Int64             // buckets pushed out while not yet full
}

type bucket struct {
	key  string
	lim  *rate.Limiter
	last time.Time
}

func newLimiter(l rate.Limit, burst, maxKeys int, clock func() time.Time) *limiter {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxRateKeys
	}
	return &limiter{limit: l, burst: burst, maxKeys: maxKeys, clock: clock, m: map[string]*list.Element{}, lru: list.New()}
}

// refill is how long an idle bucket takes to be full again (it can then be
// forgotten without changing behaviour).
func (l *limiter) refill() time.Duration {
	if l.limit <= 0 || l.limit == rate.Inf {
		return time.Minute
	}
	d := time.Duration(float64(l.burst) / float64(l.limit) * float64(time.Second))
	if d < time.Second {
		d = time.Second
	}
	return d
}

// allow takes one token for key; if refused it returns the wait in ms (≥ 1).
func (l *limiter) allow(key string) (ok bool, retryAfterMs int64) {
	if l.limit == rate.Inf {
		return true, 0
	}
	now := l.clock()
	l.mu.Lock()
	defer l.mu.Unlock()
	// Forget idle (full again) buckets, oldest first: O(forgotten).
	idle := l.refill()
	for e := l.lru.Back(); e != nil; e = l.lru.Back() {
		b := e.Value.(*bucket)
		if now.Sub(b.last) <= idle {
			break
		}
		l.lru.Remove(e)
		delete(l.m, b.key)
	}
	var b *bucket
	if e := l.m[key]; e != nil {
		b = e.Value.(*bucket)
		l.lru.MoveToFront(e)
	} else {
		for l.lru.Len() >= l.maxKeys {
			old := l.lru.Back()
			l.lru.Remove(old)
			delete(l.m, old.Value.(*bucket).key)
			l.evicted.Add(1)
		}
		b = &bucket{key: key, lim: rate.NewLimiter(l.limit, l.burst)}
		l.m[key] = l.lru.PushFront(b)
	}
	b.last = now
	if b.lim.AllowN(now, 1) {
		return true, 0
	}
	r := b.lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	r.CancelAt(now)
	if !r.OK() || d == rate.InfDuration {
		return false, l.refill().Milliseconds()
	}
	ms := int64(math.Ceil(float64(d) / float64(time.Millisecond)))
	if ms < 1 {
		ms = 1
	}
	return false, ms
}

// clientIP is the caller's address (see clientip.Of).
func clientIP(r *http.Request, trustProxy int) string { return clientip.Of(r, trustProxy) }
