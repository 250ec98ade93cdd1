package pairing

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// releaser returns the garbage of a burst of pairings to the operating
// system once the burst is over, instead of when the runtime next gets to it.
//
// Why: pairing a tab (an HTTP upgrade through net/http, whose 4 KiB read and
// write buffers the hijacked socket does not keep; the token record's write;
// the hello; the audit entries) leaves about 20–30 KiB of garbage behind,
// four times what the idle tab then keeps. After a reconnect storm (a
// restart, a network blip: every tab pairs again within seconds) the heap
// the runtime grew for it stays mapped until the next GC, which an idle
// server runs only every two minutes, and is returned gradually after it:
// at 1,000 tabs that is more memory than the tabs themselves hold. So when
// at least releaseBurst sockets were accepted and then releaseQuiet registry
// ticks passed without one (the burst's tabs have parked by then), the
// registry loop starts debug.FreeOSMemory on a goroutine of its own: one GC
// and one return of free pages, about 5 ms of CPU per 10 MiB of live heap
// (~50 ms of CPU, ~0.25 s, at 100 MiB), during which the loop goes on
// pinging tabs and timing out writes (it used to wait for it). It runs at
// most once per releaseEvery, one at a time, and never while tabs keep
// pairing. Counted in Stats.MemoryReleases when it returns; Shutdown waits
// for a release under way (wg).
type releaser struct {
	accepted atomic.Int64 // sockets registered since New

	burst int64         // accepts since the last release that make a burst
	quiet int           // ticks without an accept that end it
	every time.Duration // at least this long between releases

	// Loop goroutine only.
	seen       int64 // accepted at the last tick
	since      int64 // accepted at the last release
	quietTicks int
	last       time.Time

	releases atomic.Int64
	running  atomic.Bool     // a release under way
	wg       *sync.WaitGroup // the registry's: Shutdown waits for a release
	free     func()          // debug.FreeOSMemory, or a test's
}

const (
	releaseBurst = 256
	releaseQuiet = 3
	releaseEvery = time.Minute
)

func (l *releaser) init() {
	l.burst, l.quiet, l.every, l.free = releaseBurst, releaseQuiet, releaseEvery, debug.FreeOSMemory
}

// tick runs on every registry tick and releases memory when a burst of
// pairings is over.
func (l *releaser) tick(now time.Time) {
	n := l.accepted.Load()
	if n != l.seen {
		l.seen, l.quietTicks = n, 0
		return
	}
	if n-l.since < l.burst {
		return
	}
	l.quietTicks++
	if l.quietTicks < l.quiet || (!l.last.IsZero() && now.Sub(l.last) < l.every) || l.running.Load() {
		return
	}
	l.since, l.last = n, now
	l.running.Store(true)
	if l.wg == nil { // a test's releaser: in line
		l.release()
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.release()
	}()
}

func (l *releaser) release() {
	l.free()
	l.releases.Add(1)
	l.running.Store(false)
}
