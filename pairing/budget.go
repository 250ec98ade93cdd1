package pairing

import (
	"encoding/json"
	"time"

	"golang.org/x/time/rate"
)

// What a tab may make lapd keep, and how fast it may talk. Everything kept
// per tid is counted in bytes: its recent-log ring (at most LogRing entries
// and LogRingBytes) and its cached hello (at most MaxHello: a hello over it
// closes its socket with 1009). Over all tids, live and recently closed,
// rings and hellos share BufferBytes; past it lapd sheds, in order, the
// buffers of closed tabs (oldest first), then the oldest log entries of the
// tid keeping the most, then, for a tab whose hello still does not fit, the
// live tabs holding larger hellos than its own, largest first: each is
// closed with 1013 (try again later). A hello that is itself the largest
// closes its own socket with 1013. Every shed is counted (Stats) and logged.
//
// What that means for whoever holds a tab token (anonymous mints are allowed,
// 30 per minute per IP by default): a hello costs at most MaxHello (1 MiB),
// so filling the 128 MiB budget with hellos takes 128 live sockets with
// distinct hellos (4 minutes of one IP's mints); such sockets cannot lock
// out a tab whose hello is smaller than theirs (an app's real hello is a few
// KiB): the newcomer sheds them. To refuse it, the attacker's hellos must be
// no larger than the newcomer's, so 128 MiB / (its size) live sockets (about
// 13,000 for a 10 KiB hello, 7 hours of one IP's mints). Being shed and
// reconnecting with the same large hello only refuses the reconnecting socket.
//
// Inbound frames are rate-limited per socket, in frames and bytes:
// over the rate the reader waits (TCP pushes back on the tab), nothing is
// dropped. Answers to the server's own calls are not counted (see
// session.solicited).
const (
	DefaultLogRingBytes = 1 << 20   // per tid
	DefaultBufferBytes  = 128 << 20 // rings and hellos of every tid
	DefaultMaxHello     = 1 << 20   // one hello, as helloSize counts it (a quarter of MaxFrame)
	DefaultFrameRate    = 200       // inbound frames per second per socket
	DefaultFrameBurst   = 1000
	DefaultByteRate     = 8 << 20 // inbound bytes per second per socket (burst: 2 × MaxFrame)

	// CloseOverloaded: lapd is over its memory budget; reconnect later.
	CloseOverloaded = 1013
)

// shedLogEvery bounds the shedding log lines.
const shedLogEvery = 10 * time.Second

// What a kept hello and a kept log entry hold in the heap besides their
// bytes, measured by TestSizesCoverTheHeap (go test ./pairing -run
// TestSizesCoverTheHeap -v):
//
//   - a distinct hello (one per tab, the worst case: tabs of one app share
//     one copy) held 525 B for 239 B of fields: the Hello, its interning
//     entry and weak pointer, and the rounding of its six allocations; 286 B
//     besides the bytes, counted 384 (it was 256). The weak pointer's and
//     cleanup's runtime records (~100 B) are off the Go heap and not in
//     that figure.
//   - a log entry held 113 B for 61 bytes (64 allocated) in a ring that has
//     turned over (the ring's backing array grows to about twice its
//     entries), 88 B with one entry per tid: 49 B besides the allocation,
//     counted 64 plus the entry's capacity, which is its allocation when
//     lapd copied it (before, its length alone: a ring held 1.8 times its
//     figure).
const (
	helloOverhead    = 384
	logEntryOverhead = 64
)

// helloSize is what a cached hello costs.
func helloSize(h *Hello) int {
	if h == nil {
		return 0
	}
	return len(h.AppName) + len(h.AppVersion) + len(h.MsgSchema) + len(h.StateSchema) +
		len(h.AffordancesSample) + len(h.Docs) + len(h.SchemaHash) + len(h.Policy) + helloOverhead
}

// logEntrySize is what a kept log entry costs.
func logEntrySize(e json.RawMessage) int { return cap(e) + logEntryOverhead }

// releaseBuffersLocked drops s's ring and hello and returns the bytes freed.
// Caller holds s.mu.
func (s *session) releaseBuffersLocked() int {
	n := s.ringBytes + helloSize(s.hello)
	s.ring, s.ringBytes, s.hello = nil, 0, nil
	return n
}

// appendLogLocked puts e at the end of the ring (oldest first), dropping the
// oldest past maxN entries or maxBytes, and returns the change in bytes.
// Caller holds s.mu.
func (s *session) appendLogLocked(e json.RawMessage, maxN, maxBytes int) (delta, dropped int) {
	s.ring = append(s.ring, e)
	s.ringBytes += logEntrySize(e)
	delta = logEntrySize(e)
	for len(s.ring) > maxN || (s.ringBytes > maxBytes && len(s.ring) > 1) {
		n := logEntrySize(s.ring[0])
		s.ring[0] = nil
		s.ring = s.ring[1:]
		s.ringBytes -= n
		delta -= n
		dropped++
	}
	return delta, dropped
}

// overBudget reports whether rings and hellos are over BufferBytes.
func (r *Registry) overBudget() bool { return r.bufBytes.Load() > int64(r.cfg.BufferBytes) }

// shed brings rings and hellos back under BufferBytes: closed tabs' buffers
// first, oldest closed first, then the oldest log entries of the tid keeping
// the most. It reports whether they fit now (live hellos are never shed
// here).
func (r *Registry) shed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	freed, entries, closed := 0, 0, 0
	for e := r.closed.Front(); e != nil && r.overBudget(); e = r.closed.Front() {
		s := e.Value.(*session)
		r.closed.Remove(e)
		s.closedElem = nil
		if r.sessions[s.tid] == s {
			delete(r.sessions, s.tid)
		}
		s.mu.Lock()
		n := s.releaseBuffersLocked()
		s.dropped = true
		s.mu.Unlock()
		r.bufBytes.Add(-int64(n))
		freed += n
		closed++
	}
	for r.overBudget() {
		var heavy *session
		heavyBytes := 0
		for _, s := range r.sessions {
			s.mu.Lock()
			if len(s.ring) > 0 && s.ringBytes > heavyBytes {
				heavy, heavyBytes = s, s.ringBytes
			}
			s.mu.Unlock()
		}
		if heavy == nil {
			break
		}
		heavy.mu.Lock()
		for len(heavy.ring) > 0 && r.overBudget() {
			n := logEntrySize(heavy.ring[0])
			heavy.ring[0] = nil
			heavy.ring = heavy.ring[1:]
			heavy.ringBytes -= n
			r.bufBytes.Add(-int64(n))
			freed += n
			entries++
			if heavy.ringBytes < heavyBytes/2 {
				break // look for the heaviest again
			}
		}
		heavy.mu.Unlock()
	}
	if closed+entries > 0 {
		r.logDropped.Add(int64(entries))
		r.closedShed.Add(int64(closed))
		if now := time.Now(); now.Sub(r.lastShedLog) > shedLogEvery {
			r.lastShedLog = now
			r.cfg.Logger.Warn("pairing: tab buffers over budget; shed closed tabs' buffers and old log entries",
				"closed_tabs", closed, "log_entries", entries, "freed_bytes", freed, "kept_bytes", r.bufBytes.Load(), "budget", r.cfg.BufferBytes)
		}
	}
	return !r.overBudget()
}

// shedHellos makes room for s's hello of size bytes once shed could not:
// while rings and hellos are over BufferBytes, the live session holding the
// largest hello, if it is larger than size, is closed with 1013 (its
// buffers dropped, audited as a disconnect "overloaded"). It reports whether
// they fit now; false means s's hello is itself the largest (ties included)
// and s is the one to refuse. A few sessions holding huge hellos thus cannot
// lock out tabs with ordinary ones: they are shed first.
func (r *Registry) shedHellos(s *session, size int) bool {
	for r.overBudget() {
		var heavy *session
		heavyBytes := size
		r.mu.Lock()
		for _, o := range r.sessions {
			if o == s {
				continue
			}
			o.mu.Lock()
			if n := helloSize(o.hello); n > heavyBytes && o.cur != nil && !o.dropped {
				heavy, heavyBytes = o, n
			}
			o.mu.Unlock()
		}
		r.mu.Unlock()
		if heavy == nil {
			return false
		}
		r.overloadCloses.Add(1)
		r.hellosShed.Add(1)
		r.cfg.Logger.Warn("pairing: tab buffers over budget; closing the tab holding the largest hello with 1013 to make room for a smaller one",
			"tid", heavy.tid, "hello_bytes", heavyBytes, "for_tid", s.tid, "for_hello_bytes", size,
			"kept_bytes", r.bufBytes.Load(), "budget", r.cfg.BufferBytes)
		r.dropSession(heavy, CloseOverloaded, overloadedText, "overloaded")
	}
	return true
}

// overloadedText is the close reason sent with CloseOverloaded.
const overloadedText = "lapd is over its memory budget; retry later"

// inbound rate-limits one socket's frames.
type inbound struct {
	frames, bytes *rate.Limiter
}

func (r *Registry) newInbound() inbound {
	return inbound{
		frames: rate.NewLimiter(rate.Limit(r.cfg.FrameRate), r.cfg.FrameBurst),
		bytes:  rate.NewLimiter(rate.Limit(r.cfg.ByteRate), int(2*r.cfg.MaxFrame)),
	}
}

// wait holds the reader until a frame of n bytes is within the socket's
// rates (or the registry shuts down).
func (in inbound) wait(r *Registry, n int) {
	now := time.Now()
	fr := in.frames.ReserveN(now, 1)
	br := in.bytes.ReserveN(now, min(n, in.bytes.Burst()))
	d := max(fr.DelayFrom(now), br.DelayFrom(now))
	if d <= 0 {
		return
	}
	r.throttled.Add(1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.stop:
	}
}
