package lapd

import (
	"context"
	"slices"
	"sync"

	"github.com/lapd-dev/lapd/audit"
)

// auditRing keeps the latest audit entries in memory, for the admin console
// of a lapd whose sinks cannot be read back (--audit stdout or none). It is
// bounded in bytes, oldest out first. An entry is counted as the memory it
// holds (entrySize: its strings plus Go's per-value overhead), estimated
// without encoding it: the ring sits on the audit path of every call.
type auditRing struct {
	mu      sync.Mutex
	entries []ringEntry // oldest first, from head on
	head    int         // entries before it are gone
	bytes   int
	max     int
}

type ringEntry struct {
	e    audit.Entry
	size int
}

// defaultAuditRingBytes bounds the ring: about 10,000 typical entries.
const defaultAuditRingBytes = 8 << 20

// entrySize estimates the heap bytes e holds: its strings, for the Detail
// map Go's bucket overhead per key and the boxed values, and its slots in
// the ring: 88 bytes each, and the array holds up to about three per live
// entry (dead ones until half are, and room to grow). 256 was measured to
// cover it (TestAuditRingSizesCoverTheHeap: 623 B held per entry of a
// turned-over ring, counted 571 with 96, 731 now).
func entrySize(e audit.Entry) int {
	return 256 + len(e.TID) + len(e.UID) + len(e.Event) + valueSize(e.Detail, 0)
}

func valueSize(v any, depth int) int {
	switch x := v.(type) {
	case string:
		return 16 + len(x)
	case map[string]any:
		n := 48
		for k, v := range x {
			n += 48 + len(k)
			if depth < audit.MaxDetailDepth {
				n += valueSize(v, depth+1)
			}
		}
		return n
	case []any:
		n := 24
		for _, v := range x {
			if depth < audit.MaxDetailDepth {
				n += 16 + valueSize(v, depth+1)
			}
		}
		return n
	}
	return 16
}

var (
	_ audit.Sink    = (*auditRing)(nil)
	_ audit.Querier = (*auditRing)(nil)
)

func newAuditRing(maxBytes int) *auditRing { return &auditRing{max: maxBytes} }

// Write implements audit.Sink.
func (r *auditRing) Write(_ context.Context, e audit.Entry) error {
	size := entrySize(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	if size > r.max {
		return nil
	}
	r.entries = append(r.entries, ringEntry{e, size})
	r.bytes += size
	for r.bytes > r.max {
		r.bytes -= r.entries[r.head].size
		r.entries[r.head] = ringEntry{}
		r.head++
	}
	if r.head > len(r.entries)/2 { // compact once half is dead: O(1) amortised
		r.entries = append(r.entries[:0], r.entries[r.head:]...)
		r.head = 0
	}
	return nil
}

// Close implements audit.Sink.
func (r *auditRing) Close() error { return nil }

// Query implements audit.Querier with audit.Filter's semantics.
func (r *auditRing) Query(_ context.Context, f audit.Filter) ([]audit.Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []audit.Entry
	skip := 0
	for i := len(r.entries) - 1; i >= r.head; i-- { // newest first
		e := r.entries[i].e
		if !match(f, e) {
			continue
		}
		if f.Limit > 0 && skip < f.Offset {
			skip++
			continue
		}
		out = append(out, e)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	slices.Reverse(out)
	return out, nil
}

func match(f audit.Filter, e audit.Entry) bool {
	return (f.TID == "" || e.TID == f.TID) &&
		(f.Event == "" || e.Event == f.Event) &&
		(len(f.Events) == 0 || slices.Contains(f.Events, e.Event)) &&
		e.At >= f.Since &&
		(f.Until == 0 || e.At < f.Until)
}
