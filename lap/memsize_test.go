package lap

import (
	"encoding/json"
	"fmt"
	"github.com/lapd-dev/lapd/internal/heaptest"
	"runtime"
	"testing"
	"time"
)

// The idempotency byte budgets (IdemBytes, IdemBytesPerTID, --max-kept-mib)
// count what a remembered /message outcome costs in memory: idemEntry.size
// must cover what the heap really holds for one, or the budget holds
// several times its figure. Two shapes: one key per session (many
// anonymous sessions: the per-session map is paid by one key) and a
// hundred per session.
//
//	go test ./lap -run TestIdemSizesCoverTheHeap -v
func TestIdemSizesCoverTheHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates tens of MB")
	}
	for _, shape := range []struct{ tids, per int }{{10000, 1}, {100, 100}} {
		t.Run(fmt.Sprintf("%dx%d", shape.tids, shape.per), func(t *testing.T) {
			idemSizesCoverTheHeap(t, shape.tids, shape.per)
		})
	}
}

func idemSizesCoverTheHeap(t *testing.T, tids, per int) {
	im := newIdempotency(time.Minute, per, 1<<30, 1<<30, time.Now)
	ctx := t.Context()
	tid := func(i int) string { return fmt.Sprintf("6f1c2d3e-4b5a-4c6d-8e7f-%012d", i) }          // lapd's tids are UUIDs
	key := func(i, j int) string { return fmt.Sprintf("0b9e6d2c-57a1-4f3e-9c1d-%08x%04x", i, j) } // MCP's keys are UUIDs
	body := func() (any, *apiError) { return json.RawMessage(`{"ok":true,"result":{"id":7}}`), nil }
	before := heaptest.Live()
	for i := range tids {
		for j := range per {
			if _, ae := im.do(ctx, tid(i), key(i, j), body); ae != nil {
				t.Fatal(ae)
			}
		}
	}
	after := heaptest.Live()
	keys, bytes, _ := im.stats()
	if keys != tids*per {
		t.Fatalf("%d keys kept, want %d", keys, tids*per)
	}
	held := float64(after-before) / float64(keys)
	counted := float64(bytes) / float64(keys)
	t.Logf("%.0f B held per key, %.0f B counted", held, counted)
	if held > counted {
		t.Errorf("a remembered key holds %.0f B of heap but is counted at %.0f B: the budget understates memory %.1f×", held, counted, held/counted)
	}
	runtime.KeepAlive(im)
}

// A rate limiter is bounded by count (DefaultMaxRateKeys per limiter), not
// bytes: this measures what a key costs, for the figure in its doc.
//
//	go test ./lap -run TestLimiterKeyCost -v
func TestLimiterKeyCost(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates MBs")
	}
	const n = 20000
	l := newLimiter(1, 30, 0, time.Now)
	before := heaptest.Live()
	for i := range n {
		l.allow(fmt.Sprintf("ip:2001:db8:%x:%x::", i>>16, i&0xffff)) // an IPv6 /64, the longest ordinary key
	}
	after := heaptest.Live()
	held := float64(after-before) / n
	t.Logf("%.0f B held per key, its string included", held)
	const docFigure = 300 // DefaultMaxRateKeys' doc: ~250 B a key, ~25 MB per full limiter
	if held > docFigure {
		t.Errorf("a rate-limit key holds %.0f B, over the %d B its doc says", held, docFigure)
	}
	runtime.KeepAlive(l)
}
