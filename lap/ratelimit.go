package lap

import (
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// DefaultMaxRateKeys caps how many keys a limiter tracks at once.
const DefaultMaxRateKeys = 100_000

// limiter is a set of token buckets keyed by a string (tid, uid or client IP).
// Idle buckets (full again) are swept lazily; over maxKeys a new key is
// refused rather than growing the map.
type limiter struct {
	limit     rate.Limit
	burst     int
	maxKeys   int
	clock     func() time.Time
	mu        sync.Mutex
	m         map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time
}

func newLimiter(l rate.Limit, burst, maxKeys int, clock func() time.Time) *limiter {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxRateKeys
	}
	return &limiter{limit: l, burst: burst, maxKeys: maxKeys, clock: clock, m: map[string]*bucket{}}
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
	if now.Sub(l.lastSweep) > l.refill() {
		l.lastSweep = now
		idle := l.refill()
		for k, b := range l.m {
			if now.Sub(b.last) > idle {
				delete(l.m, k)
			}
		}
	}
	b := l.m[key]
	if b == nil {
		if len(l.m) >= l.maxKeys {
			return false, l.refill().Milliseconds()
		}
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.m[key] = b
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

// clientIP is the caller's address: with trustProxy = n > 0 the n-th entry
// from the end of X-Forwarded-For (ignored when the chain is shorter), else
// the socket's remote host.
func clientIP(r *http.Request, trustProxy int) string {
	if trustProxy > 0 {
		var hops []string
		for _, v := range r.Header.Values("X-Forwarded-For") {
			for _, p := range strings.Split(v, ",") {
				if p = strings.TrimSpace(p); p != "" {
					hops = append(hops, p)
				}
			}
		}
		if len(hops) >= trustProxy {
			return hops[len(hops)-trustProxy]
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
