package lap

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// MaxIdempotencyKeyLen caps a /message idempotencyKey.
const MaxIdempotencyKeyLen = 200

// MaxIdempotencyEntries caps remembered /message outcomes over all sessions.
const MaxIdempotencyEntries = 50_000

// Byte budgets of the remembered /message bodies (defaults of
// Config.IdemBytesPerTID and Config.IdemBytes).
const (
	DefaultIdemBytesPerTID = 16 << 20
	DefaultIdemBytes       = 128 << 20
)

// CodeOutcomeUnknown answers a /message retry whose first call reached the
// tab without a known outcome (409).
const CodeOutcomeUnknown = "outcome-unknown"

// idempotency remembers /message outcomes by (tid, key) for ttl. A repeat
// while the first is running waits for it, then:
//
//   - the first answered 200: the repeat gets the same body;
//   - the first failed after its rpc frame was queued for the tab, without
//     the tab's answer (paused, timeout, shutting down): the tab may have
//     dispatched, so the repeat gets 409 outcome-unknown, never a second
//     dispatch;
//   - the first failed before the tab could act, or the tab answered with an
//     error: the key is forgotten and the repeat runs again.
//
// Bodies are counted in bytes: at most bytesPerTID per tid (its oldest body
// goes first) and maxBytes in all (the oldest body of the tid holding the
// most goes first, so one session cannot push out another's). A body shed
// for the budget leaves its key behind, answered 409 outcome-unknown.
//
// Keys are counted per tid (maxKeys, its oldest finished key goes first)
// and in all (maxTotal). A tid under its cap is never refused because other
// sessions filled the table: a new key then takes the place of the oldest
// finished key of the tid holding the most keys (many anonymous tokens of
// one client fill the table in minutes, and every MCP send_message carries
// a key). A key still in flight is never dropped: its repeat must wait for
// it, not dispatch again. Only when the caller's own tid holds the most, or
// every key in the table is in flight, is the new key refused (429).
type idempotency struct {
	ttl         time.Duration
	maxKeys     int // per tid
	maxTotal    int // over all tids
	bytesPerTID int
	maxBytes    int
	clock       func() time.Time
	onShed      func(tid string, n int) // a body was dropped for the budget; nil = nothing

	mu        sync.Mutex
	m         map[string]*idemTID
	total     int
	bytes     int
	lastSweep time.Time
	shed      int64
}

type idemTID struct {
	keys    map[string]*idemEntry
	bytes   int
	running int // keys in idemRunning: not evictable
}

type idemState uint8

const (
	idemRunning idemState = iota
	idemDone              // body is the 200 response
	idemUnknown           // the tab may have acted; no outcome
	idemShed              // done, but the body was dropped for the byte budget
)

type idemEntry struct {
	done    chan struct{} // closed when the first call ends
	state   idemState
	body    json.RawMessage
	expires time.Time
}

// idemOverhead is what the heap holds for a remembered key besides its key
// and body bytes: the entry, its done channel, its map slot, and, when a
// session has one key (the worst case: many anonymous sessions), the
// session's tid, idemTID and key map. TestIdemSizesCoverTheHeap measured
// 628 B held for a 36-byte key and a 29-byte body with one key per session
// (293 B at a hundred per session), so 563 B besides the bytes; rounded up.
// It was 64, so the budget held up to 4.9 times its figure.
const idemOverhead = 640

func (e *idemEntry) size(key string) int { return len(key) + len(e.body) + idemOverhead }

func newIdempotency(ttl time.Duration, maxKeys, bytesPerTID, maxBytes int, clock func() time.Time) *idempotency {
	return &idempotency{ttl: ttl, maxKeys: maxKeys, maxTotal: MaxIdempotencyEntries,
		bytesPerTID: bytesPerTID, maxBytes: maxBytes, clock: clock, m: map[string]*idemTID{}}
}

// errIdemFull: the caller's own session holds the most keys (or its cap)
// and none of them can go (all in flight).
var errIdemFull = errf(http.StatusTooManyRequests, CodeRateLimited, "too many idempotency keys in flight for this session")

// errIdemBusy: the table is full and every key in it is still in flight.
var errIdemBusy = &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited, retryAfter: 2000,
	detail: "lapd remembers as many idempotency keys as it can, and every one of them is still in flight; retry in a few seconds"}

func outcomeUnknown(shed bool) *apiError {
	d := "a call with this idempotencyKey reached the app, but its outcome is unknown (the tab went away or did not answer in time); observe before retrying: call observe to see whether it took effect, and if it did not, send it again with a new idempotencyKey"
	if shed {
		d = "a call with this idempotencyKey was dispatched, but its result is no longer kept (memory limit); observe before retrying: call observe to see its effect"
	}
	return errf(http.StatusConflict, CodeOutcomeUnknown, d)
}

// do runs fn once per (tid, key) within ttl (see the type's doc).
func (im *idempotency) do(ctx context.Context, tid, key string, fn func() (any, *apiError)) (any, *apiError) {
	for {
		now := im.clock()
		im.mu.Lock()
		// A full table is swept at most once a second: a sweep walks every
		// key (1 ms at 50,000), and room is made by eviction meanwhile.
		if since := now.Sub(im.lastSweep); since > im.ttl || (im.total >= im.maxTotal && since > time.Second) {
			im.lastSweep = now
			im.sweepLocked(now)
		}
		t := im.m[tid]
		if t == nil {
			t = &idemTID{keys: map[string]*idemEntry{}}
			im.m[tid] = t
		}
		e := t.keys[key]
		if e != nil && e.state != idemRunning && now.After(e.expires) {
			im.removeLocked(t, key, e)
			e = nil
		}
		if e == nil {
			if ae := im.makeRoomLocked(t, now); ae != nil {
				im.mu.Unlock()
				return nil, ae
			}
			e = &idemEntry{done: make(chan struct{})}
			t.keys[key] = e
			t.running++
			t.bytes += e.size(key)
			im.bytes += e.size(key)
			im.total++
			im.mu.Unlock()
			return im.run(tid, key, e, fn)
		}
		im.mu.Unlock()
		select {
		case <-e.done:
			im.mu.Lock()
			state, body := e.state, e.body
			im.mu.Unlock()
			switch state {
			case idemDone:
				return body, nil
			case idemUnknown:
				return nil, outcomeUnknown(false)
			case idemShed:
				return nil, outcomeUnknown(true)
			}
			// the first was refused before the tab could act: run again
		case <-ctx.Done():
			return nil, errf(http.StatusGatewayTimeout, CodeTimeout, "request cancelled while an identical request was running")
		}
	}
}

func (im *idempotency) run(tid, key string, e *idemEntry, fn func() (any, *apiError)) (body any, ae *apiError) {
	var enc json.RawMessage
	defer func() {
		im.mu.Lock()
		t := im.m[tid]
		mine := t != nil && t.keys[key] == e
		if mine {
			t.running--
		}
		switch {
		case ae == nil:
			e.state, e.body = idemDone, enc
			e.expires = im.clock().Add(im.ttl)
			if mine {
				t.bytes += len(enc)
				im.bytes += len(enc)
				im.enforceLocked(tid, t)
			}
		case ae.inDoubt:
			e.state = idemUnknown
			e.expires = im.clock().Add(im.ttl)
		default:
			if mine {
				im.removeLocked(t, key, e)
			}
		}
		close(e.done)
		im.mu.Unlock()
	}()
	body, ae = fn()
	if ae == nil {
		var err error
		if enc, err = encodeBody(body); err != nil {
			ae = errf(http.StatusInternalServerError, CodeInternal, "encode response: "+err.Error())
			return nil, ae
		}
		return enc, nil
	}
	return nil, ae
}

// encodeBody is the response body writeJSON would write for v.
func encodeBody(v any) (json.RawMessage, error) {
	switch x := v.(type) {
	case json.RawMessage:
		return x, nil
	case []byte:
		return x, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// enforceLocked sheds bodies until tid t and the total are within budget.
func (im *idempotency) enforceLocked(tid string, t *idemTID) {
	for t.bytes > im.bytesPerTID && im.shedOldestLocked(tid, t) {
	}
	for im.bytes > im.maxBytes {
		var heavy *idemTID
		var heavyTID string
		for id, x := range im.m {
			if heavy == nil || x.bytes > heavy.bytes {
				heavy, heavyTID = x, id
			}
		}
		if heavy == nil || !im.shedOldestLocked(heavyTID, heavy) {
			return
		}
	}
}

// shedOldestLocked drops the body of t's oldest finished entry, keeping its
// key (a repeat is then told outcome-unknown). False if none has a body.
func (im *idempotency) shedOldestLocked(tid string, t *idemTID) bool {
	var oldest *idemEntry
	for _, e := range t.keys {
		if e.state == idemDone && len(e.body) > 0 && (oldest == nil || e.expires.Before(oldest.expires)) {
			oldest = e
		}
	}
	if oldest == nil {
		return false
	}
	n := len(oldest.body)
	t.bytes -= n
	im.bytes -= n
	oldest.body, oldest.state = nil, idemShed
	im.shed++
	if im.onShed != nil {
		im.onShed(tid, n)
	}
	return true
}

func (im *idempotency) removeLocked(t *idemTID, key string, e *idemEntry) {
	delete(t.keys, key)
	t.bytes -= e.size(key)
	im.bytes -= e.size(key)
	im.total--
}

// makeRoomLocked makes room for one more key of tid t, within t's cap and
// the table's (see the type's doc), or says why it cannot.
func (im *idempotency) makeRoomLocked(t *idemTID, now time.Time) *apiError {
	if len(t.keys) >= im.maxKeys && !im.evictKeyLocked(t, now) {
		return errIdemFull
	}
	if im.total < im.maxTotal {
		return nil
	}
	heavy := im.heaviestLocked()
	switch {
	case heavy == nil:
		return errIdemBusy
	case len(t.keys) >= len(heavy.keys):
		// This session holds the most: it gives up its own oldest.
		if !im.evictKeyLocked(t, now) {
			return errIdemFull
		}
	default:
		im.evictKeyLocked(heavy, now)
	}
	return nil
}

// heaviestLocked returns the tid holding the most keys among those with a
// finished (evictable) one; nil if every key is in flight.
func (im *idempotency) heaviestLocked() *idemTID {
	var heavy *idemTID
	for _, x := range im.m {
		if len(x.keys) > x.running && (heavy == nil || len(x.keys) > len(heavy.keys)) {
			heavy = x
		}
	}
	return heavy
}

// evictKeyLocked drops expired entries of t, else its oldest finished one;
// never one in flight. False if it dropped nothing.
func (im *idempotency) evictKeyLocked(t *idemTID, now time.Time) bool {
	var oldestKey string
	var oldest *idemEntry
	freed := false
	for k, e := range t.keys {
		if e.state == idemRunning {
			continue
		}
		if now.After(e.expires) {
			im.removeLocked(t, k, e)
			freed = true
			continue
		}
		if oldest == nil || e.expires.Before(oldest.expires) {
			oldestKey, oldest = k, e
		}
	}
	if !freed && oldest != nil {
		im.removeLocked(t, oldestKey, oldest)
		freed = true
	}
	return freed
}

func (im *idempotency) sweepLocked(now time.Time) {
	for tid, t := range im.m {
		for k, e := range t.keys {
			if e.state != idemRunning && now.After(e.expires) {
				im.removeLocked(t, k, e)
			}
		}
		if len(t.keys) == 0 {
			delete(im.m, tid)
		}
	}
}

// drop forgets tid (revoke).
func (im *idempotency) drop(tid string) {
	im.mu.Lock()
	if t := im.m[tid]; t != nil {
		im.total -= len(t.keys)
		im.bytes -= t.bytes
		delete(im.m, tid)
	}
	im.mu.Unlock()
}

// stats: remembered keys, the bytes they hold, and bodies shed for the budget.
func (im *idempotency) stats() (keys, bytes int, shed int64) {
	im.mu.Lock()
	defer im.mu.Unlock()
	return im.total, im.bytes, im.shed
}
