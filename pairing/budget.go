package pairing

import (
	"encoding/json"
	"time"

	"golang.org/x/time/rate"
)

// What a tab may make lapd keep, and how fast it may talk. Everything kept
// per tid is counted in bytes: its recent-log ring (at most LogRing entries
// and LogRingBytes) and its cached hello. Over all tids, live and recently
// closed, rings and hellos share BufferBytes; past it lapd sheds, in order,
// the buffers of closed tabs (oldest first), then the oldest log entries of
// the tid keeping the most. A hello that still does not fit closes its
// socket with 1013 (try again later). Every shed is counted (Stats) and
// logged. Inbound frames are rate-limited per socket, in frames and bytes:
// over the rate the reader waits (TCP pushes back on the tab), nothing is
// dropped. Answers to the server's own calls are not counted (see
// session.solicited).
const (
	DefaultLogRingBytes = 1 << 20   // per tid
	DefaultBufferBytes  = 128 << 20 // rings and hellos of every tid
	DefaultFrameRate    = 200       // inbound frames per second per socket
	DefaultFrameBurst   = 1000
	DefaultByteRate     = 8 << 20 // inbound bytes per second per socket (burst: 2 × MaxFrame)

	// CloseOverloaded: lapd is over its memory budget; reconnect later.
	CloseOverloaded = 1013
)

// shedLogEvery bounds the shedding log lines.
const shedLogEvery = 10 * time.Second

// helloSize is what a cached hello costs.
func helloSize(h *Hello) int {
	if h == nil {
		return 0
	}
	return len(h.AppName) + len(h.AppVersion) + len(h.MsgSchema) + len(h.StateSchema) +
		len(h.AffordancesSample) + len(h.Docs) + len(h.SchemaHash) + len(h.Policy) + 256
}

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
	s.ringBytes += len(e)
	delta = len(e)
	for len(s.ring) > maxN || (s.ringBytes > maxBytes && len(s.ring) > 1) {
		n := len(s.ring[0])
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
			n := len(heavy.ring[0])
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
