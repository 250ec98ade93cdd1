package audit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

// Record takes the request id from the context into detail.rid (the wire
// shape stays {at, tid, uid, event, detail}), without touching the
// caller's map; an id that fails ValidRequestID is left out.
func TestRecordStampsRequestID(t *testing.T) {
	sink := &memSink{}
	l := audit.New(audit.Config{Sinks: []audit.Sink{sink}})
	defer l.Close()
	d := map[string]any{"tool": "observe"}
	l.Record(audit.WithRequestID(context.Background(), "r-1"), audit.Entry{Event: audit.EventLapCall, Detail: d})
	l.Record(context.Background(), audit.Entry{Event: audit.EventMint})
	l.Record(audit.WithRequestID(context.Background(), "agt_secret"), audit.Entry{Event: audit.EventMint})
	l.Record(context.Background(), audit.Entry{Event: audit.EventRevoke, RequestID: "r-2"})
	if f, ok := any(l).(interface{ Flush(context.Context) error }); ok { // an asynchronous Log
		_ = f.Flush(context.Background())
	}
	es := sink.all()
	if len(es) != 4 {
		t.Fatalf("%d entries", len(es))
	}
	got := []any{es[0].Detail["rid"], es[1].Detail["rid"], es[2].Detail["rid"], es[3].Detail["rid"]}
	if got[0] != "r-1" || got[1] != nil || got[2] != nil || got[3] != "r-2" {
		t.Errorf("rids %v", got)
	}
	if _, ok := d["rid"]; ok {
		t.Error("Record changed the caller's detail map")
	}
	b, _ := es[0].MarshalJSON()
	if !strings.Contains(string(b), `"detail":{"rid":"r-1","tool":"observe"}`) && !strings.Contains(string(b), `"detail":{"tool":"observe","rid":"r-1"}`) {
		t.Errorf("wire shape %s", b)
	}
}

func TestRequestIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := audit.NewRequestID()
		if !audit.ValidRequestID(id) || seen[id] {
			t.Fatalf("NewRequestID %q (valid %v, repeated %v)", id, audit.ValidRequestID(id), seen[id])
		}
		seen[id] = true
	}
	for _, bad := range []string{"", "agt_x", "a b", `a"`, "é", strings.Repeat("a", audit.MaxRequestID+1)} {
		if audit.ValidRequestID(bad) {
			t.Errorf("ValidRequestID(%q) = true", bad)
		}
	}
	if audit.RequestID(context.Background()) != "" {
		t.Error("a bare context has a request id")
	}
}
