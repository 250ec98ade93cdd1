package lapd

import (
	"fmt"
	"github.com/lapd-dev/lapd/internal/heaptest"
	"runtime"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

// The admin console's audit ring is bounded in bytes (entrySize): what it
// counts must cover what the heap holds for an entry, its Detail map and
// the ring's slot included. Entries shaped as lap records a call (a tid, a
// uid, five details), each with its own strings (the worst case: in lapd
// the tid is often shared with the session), in a ring that has not
// turned over and in one that has (its array grows, then is compacted).
//
//	go test . -run TestAuditRingSizesCoverTheHeap -v
func TestAuditRingSizesCoverTheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MBs")
	}
	for _, shape := range []struct {
		name   string
		max, n int
	}{{"growing", 1 << 30, 10000}, {"turned over", 2 << 20, 20000}} {
		t.Run(shape.name, func(t *testing.T) { auditRingSizesCoverTheHeap(t, shape.max, shape.n) })
	}
}

func auditRingSizesCoverTheHeap(t *testing.T, max, n int) {
	r := newAuditRing(max)
	before := heaptest.Live()
	for i := range n {
		_ = r.Write(t.Context(), audit.Entry{At: int64(i), TID: fmt.Sprintf("6f1c2d3e-4b5a-4c6d-8e7f-%012d", i), UID: fmt.Sprintf("user-%d", i),
			Event: audit.EventLapCall, Detail: map[string]any{
				"tool": "send_message", "variant": "addTask", "status": "ok", "ms": int64(12 + i%7), "rid": fmt.Sprintf("r-%08x", i)}})
	}
	after := heaptest.Live()
	r.mu.Lock()
	kept := float64(len(r.entries) - r.head)
	counted := float64(r.bytes) / kept
	r.mu.Unlock()
	held := float64(after-before) / kept
	t.Logf("%.0f B held per audit entry, %.0f B counted", held, counted)
	if held > counted {
		t.Errorf("an audit entry holds %.0f B of heap but is counted at %.0f B: the ring holds %.1f× its budget", held, counted, held/counted)
	}
	runtime.KeepAlive(r)
}
