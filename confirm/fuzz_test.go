package confirm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// FuzzConfirmFrames drives a Manager with what tabs and LAP calls can send:
// proposals, confirm-resolved frames for known and made-up ids with
// stateAfter of any size, Expect windows, revokes. Invariants after every
// step: byte and count budgets hold, the gauges match the state, and an
// outcome is only ever kept for an id that was proposed.
func FuzzConfirmFrames(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 1, 2, 3, 0, 4, 1, 5, 9, 9, 9})
	f.Add([]byte{3, 1, 1, 7, 200, 0, 7, 0, 5, 2, 2, 2, 6, 1})
	f.Add([]byte{1, 0, 0, 255, 1, 1, 1, 255, 1, 2, 2, 255, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 800 {
			ops = ops[:800]
		}
		cfg := Config{KeptBytesPerTID: 40_000, KeptBytes: 100_000, PendingBytesPerTID: 30_000, PendingBytes: 80_000}
		m, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		ctx := context.Background()
		proposed := map[key]bool{}
		var releases []func()
		at := 0
		next := func() int {
			if at >= len(ops) {
				return 0
			}
			at++
			return int(ops[at-1])
		}
		for at < len(ops) {
			op, tid, id, size := next()%8, fmt.Sprint("t", next()%3), fmt.Sprint("c", next()%6), next()*100
			blob := json.RawMessage(`"` + strings.Repeat("x", size) + `"`)
			switch op {
			case 0, 1:
				p := Pending{TID: tid, ConfirmID: id, Variant: "v", Payload: blob}
				if err := m.Propose(ctx, p); err == nil || errors.Is(err, ErrTooManyPending) {
					proposed[key{tid, id}] = true // a refused one is kept as rejected/too-many-pending
				} else if !errors.Is(err, ErrDuplicate) {
					t.Fatalf("Propose: %v", err)
				}
			case 2, 3:
				m.Resolve(ctx, tid, id, Resolution{Status: StatusConfirmed, StateAfter: blob})
			case 4:
				m.Resolve(ctx, tid, id, Resolution{Status: StatusRejected, Reason: ReasonUserCancelled})
			case 5:
				releases = append(releases, m.Expect(tid))
			case 6:
				if len(releases) > 0 {
					releases[0]()
					releases = releases[1:]
				}
			case 7:
				m.Drop(ctx, tid)
				for k := range proposed {
					if k.tid == tid {
						delete(proposed, k)
					}
				}
			}
			m.mu.Lock()
			st := Stats{PendingBytes: m.pendingBytes, KeptBytes: m.keptBytes}
			kept, pendingBytes, keptBytes := 0, 0, 0
			for tidName, ts := range m.tids {
				pb, kb := 0, 0
				for _, e := range ts.pending {
					pb += pendingSize(e.p)
				}
				for cid, e := range ts.kept {
					kb += keptSize(cid, e.res)
					if !proposed[key{tidName, cid}] {
						m.mu.Unlock()
						t.Fatalf("an outcome is kept for %s/%s, never proposed", tidName, cid)
					}
				}
				if pb != ts.pendingBytes || kb != ts.keptBytes {
					m.mu.Unlock()
					t.Fatalf("tid %s: pending %d/%d kept %d/%d bytes (state/gauge)", tidName, pb, ts.pendingBytes, kb, ts.keptBytes)
				}
				if ts.keptBytes > cfg.KeptBytesPerTID && ts.order.Len() > 1 {
					m.mu.Unlock()
					t.Fatalf("tid %s keeps %d bytes", tidName, ts.keptBytes)
				}
				if len(ts.parked) > MaxParkedPerTID {
					m.mu.Unlock()
					t.Fatalf("tid %s parks %d", tidName, len(ts.parked))
				}
				kept += len(ts.kept)
				pendingBytes += pb
				keptBytes += kb
			}
			n := m.kept.Len()
			m.mu.Unlock()
			if n != kept || st.PendingBytes != pendingBytes || st.KeptBytes != keptBytes {
				t.Fatalf("gauges %+v, state kept=%d pending=%dB kept=%dB", st, kept, pendingBytes, keptBytes)
			}
			if st.KeptBytes > cfg.KeptBytes+cfg.KeptBytesPerTID || st.PendingBytes > cfg.PendingBytes {
				t.Fatalf("over budget: %+v", st)
			}
		}
		for _, r := range releases {
			r()
		}
	})
}
