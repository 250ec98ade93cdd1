package lapd

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lapd-dev/lapd/audit"
	"github.com/lapd-dev/lapd/pairing"
)

// BenchmarkMetricsPerCall is what the metrics add to one LAP /observe call:
// its request counter and latency histogram, its RPC's, and the audit
// stream's count of its lap-call entry. Run in parallel on every CPU, as
// calls are. Compare with the server CPU time per /observe (lapbench, or
// docs/PERFORMANCE.md).
func BenchmarkMetricsPerCall(b *testing.B) {
	m := newMetrics()
	e := audit.Entry{Event: audit.EventLapCall, Detail: map[string]any{"tool": "observe", "rid": "x"}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Call("lap", "/observe", 200, 150*time.Microsecond, "")
			m.RPC("observe", 100*time.Microsecond, nil)
			_ = m.stream.Write(context.Background(), e)
		}
	})
}

// The hot path allocates nothing for metrics (outside the one exemplar per
// route and second).
func TestMetricsPerCallAllocs(t *testing.T) {
	m := newMetrics()
	m.addTools([]string{"observe"})
	e := audit.Entry{Event: audit.EventRefused, Detail: map[string]any{"endpoint": "/agent/lap/v1/observe", "code": "paused"}}
	m.Call("lap", "/observe", 200, time.Millisecond, "warm") // takes this second's exemplar
	n := testing.AllocsPerRun(1000, func() {
		m.Call("lap", "/observe", 200, time.Millisecond, "rid-1")
		m.Call("meta", "/mint", 429, time.Millisecond, "rid-1")
		m.RPC("observe", time.Millisecond, nil)
		m.ToolCall("observe", "modern", time.Millisecond, false)
		_ = m.stream.Write(context.Background(), e)
	})
	if n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
}

func TestRPCResult(t *testing.T) {
	for err, want := range map[error]string{
		nil:                          "ok",
		&pairing.RPCError{Code: "x"}: "error",
		pairing.ErrTimeout:           "timeout",
		context.DeadlineExceeded:     "timeout",
		pairing.ErrPaused:            "paused",
		pairing.ErrBusy:              "busy",
		pairing.ErrClosed:            "closed",
		context.Canceled:             "cancelled",
	} {
		if got := rpcResults[rpcResult(err)]; got != want {
			t.Errorf("rpcResult(%v) = %s, want %s", err, got, want)
		}
	}
}

// The console's in-memory audit ring stays under its byte budget (oldest
// out first) and answers Query like the other Queriers.
func TestAuditRing(t *testing.T) {
	r := newAuditRing(4 << 10)
	for i := range 200 {
		_ = r.Write(context.Background(), audit.Entry{At: int64(i), TID: "t" + string(rune('0'+i%2)), Event: audit.EventLapCall,
			Detail: map[string]any{"i": i}})
	}
	if r.bytes > r.max {
		t.Errorf("ring holds %d bytes, over %d", r.bytes, r.max)
	}
	all, _ := r.Query(context.Background(), audit.Filter{})
	if len(all) == 0 || len(all) == 200 || all[len(all)-1].At != 199 {
		t.Fatalf("ring kept %d entries, newest %v", len(all), all[len(all)-1].At)
	}
	page, _ := r.Query(context.Background(), audit.Filter{TID: "t1", Limit: 2, Offset: 1})
	if len(page) != 2 || page[0].At != 195 || page[1].At != 197 {
		t.Errorf("page: %v", page)
	}
	if _, err := r.Query(context.Background(), audit.Filter{Until: 1}); err != nil {
		t.Error(err)
	}
}

// A 503 unavailable (a store that did not answer) is counted under its own
// reason, the one to alert on when JetStream has no quorum.
func TestRefusalUnavailableCounted(t *testing.T) {
	m := newMetrics()
	e := audit.Entry{Event: audit.EventRefused, Detail: map[string]any{"endpoint": "/agent/lap/v1/mint", "code": "unavailable"}}
	_ = m.stream.Write(context.Background(), e)
	if got := m.stream.refusals[[2]string{"lap", "unavailable"}]; got == nil {
		t.Fatal("no lapd_refusals_total{surface=lap,reason=unavailable} counter")
	}
	var d dto.Metric
	if err := m.stream.refusals[[2]string{"lap", "unavailable"}].Write(&d); err != nil || d.GetCounter().GetValue() != 1 {
		t.Fatalf("counted %v (%v), want 1", d.GetCounter().GetValue(), err)
	}
}
