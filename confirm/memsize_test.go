package confirm

import (
	"encoding/json"
	"fmt"
	"github.com/lapd-dev/lapd/internal/heaptest"
	"runtime"
	"testing"
)

// The byte budgets (PendingBytes, KeptBytes, --max-kept-mib) count what an
// approval costs in memory: pendingSize and keptSize must cover what the
// heap really holds for one, or a budget of 64 MiB holds several times
// that (an outside review measured ~925 B held per pending approval
// counted at 173). Two shapes: one approval per session (many anonymous
// sessions: the per-session state is paid by one approval) and a hundred.
//
//	go test ./confirm -run TestSizesCoverTheHeap -v
func TestSizesCoverTheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates tens of MB")
	}
	for _, shape := range []struct{ tids, per int }{{10000, 1}, {100, 100}} {
		t.Run(fmt.Sprintf("%dx%d", shape.tids, shape.per), func(t *testing.T) {
			sizesCoverTheHeap(t, shape.tids, shape.per)
		})
	}
}

func sizesCoverTheHeap(t *testing.T, tids, per int) {
	m := newManager(t, Config{})
	ctx := t.Context()
	payload := json.RawMessage(`{"id":7}`)
	tid := func(i int) string { return fmt.Sprintf("6f1c2d3e-4b5a-4c6d-8e7f-%012d", i) } // lapd's tids are UUIDs
	id := func(i, j int) string { return fmt.Sprintf("c-%08x-%04x", i, j) }
	before := heaptest.Live()
	for i := range tids {
		for j := range per {
			if err := m.Propose(ctx, Pending{TID: tid(i), ConfirmID: id(i, j), Variant: "deleteTask", Payload: payload}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pending := heaptest.Live()
	st := m.Stats()
	held := float64(pending-before) / float64(st.Pending)
	counted := float64(st.PendingBytes) / float64(st.Pending)
	t.Logf("pending: %.0f B held per approval, %.0f B counted", held, counted)
	if held > counted {
		t.Errorf("a pending approval holds %.0f B of heap but is counted at %.0f B: the budget understates memory %.1f×", held, counted, held/counted)
	}
	state := json.RawMessage(`{"tasks":[]}`)
	for i := range tids {
		for j := range per {
			m.Resolve(ctx, tid(i), id(i, j), Resolution{Status: "confirmed", StateAfter: state})
		}
	}
	kept := heaptest.Live()
	st = m.Stats()
	if st.Pending != 0 || st.Kept == 0 {
		t.Fatalf("after resolving: %+v", st)
	}
	heldK := float64(kept-before) / float64(st.Kept)
	countedK := float64(st.KeptBytes) / float64(st.Kept)
	t.Logf("kept: %.0f B held per answer (%d kept), %.0f B counted", heldK, st.Kept, countedK)
	if heldK > countedK {
		t.Errorf("a kept answer holds %.0f B of heap but is counted at %.0f B: the budget understates memory %.1f×", heldK, countedK, heldK/countedK)
	}
	runtime.KeepAlive(m)
}
