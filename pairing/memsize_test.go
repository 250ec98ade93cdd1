package pairing

import (
	"encoding/json"
	"fmt"
	"github.com/lapd-dev/lapd/internal/heaptest"
	"runtime"
	"testing"
)

// BufferBytes (--max-kept-mib's quarter) counts the recent-log rings and
// the cached hellos: what it counts for them must cover what the heap
// really holds, or the budget holds several times its figure. Log entries
// in two shapes: one per session (many sessions with one entry: the ring's
// backing array is paid by one entry) and a full ring of LogRing entries.
// Hellos: distinct ones, one per session (tabs of one app share one copy,
// which holds less than it is counted).
//
//	go test ./pairing -run TestSizesCoverTheHeap -v
func TestSizesCoverTheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates tens of MB")
	}
	entry := func(i, j int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"level":"info","msg":"task %d.%d added","ts":1764170000000}`, i, j))
	}
	for _, shape := range []struct{ tids, per int }{{10000, 1}, {100, 3*DefaultLogRing + 7}} {
		t.Run(fmt.Sprintf("log %dx%d", shape.tids, shape.per), func(t *testing.T) {
			ss := make([]*session, shape.tids)
			for i := range ss {
				ss[i] = &session{}
			}
			before := heaptest.Live()
			counted, kept := 0, 0
			for i, s := range ss {
				for j := range shape.per {
					delta, _ := s.appendLogLocked(clone(entry(i, j)), DefaultLogRing, DefaultLogRingBytes)
					counted += delta
				}
				kept += len(s.ring)
			}
			after := heaptest.Live()
			n := float64(kept)
			held, per := float64(after-before)/n, float64(counted)/n
			t.Logf("%.0f B held per log entry, %.0f B counted", held, per)
			if held > per {
				t.Errorf("a log entry holds %.0f B of heap but is counted at %.0f B: the budget understates memory %.1f×", held, per, held/per)
			}
			runtime.KeepAlive(ss)
		})
	}
	t.Run("hellos", func(t *testing.T) {
		var tab helloTable
		const n = 10000
		kept := make([]*Hello, n)
		before := heaptest.Live()
		counted := 0
		for i := range kept {
			h := &Hello{AppName: "Taskboard", AppVersion: fmt.Sprintf("1.4.%d", i),
				MsgSchema:   json.RawMessage(`{"oneOf":[{"type":"object","properties":{"t":{"const":"addTask"},"title":{"type":"string"}}}]}`),
				StateSchema: json.RawMessage(`{"type":"object","properties":{"tasks":{"type":"array"}}}`),
				SchemaHash:  fmt.Sprintf("sha256:%064x", i), LapVersion: 1}
			kept[i] = tab.intern(h)
			counted += helloSize(kept[i])
		}
		after := heaptest.Live()
		held, per := float64(after-before)/n, float64(counted)/n
		t.Logf("%.0f B held per distinct hello, %.0f B counted", held, per)
		if held > per {
			t.Errorf("a hello holds %.0f B of heap but is counted at %.0f B: the budget understates memory %.1f×", held, per, held/per)
		}
		runtime.KeepAlive(kept)
	})
}
