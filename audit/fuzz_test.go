package audit_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

// FuzzScanJSONL feeds arbitrary files to the JSONL reader behind `lapd audit
// --file`: it must never panic, and every entry it returns must match the
// filter.
func FuzzScanJSONL(f *testing.F) {
	f.Add([]byte(`{"at":1,"tid":null,"uid":null,"event":"mint","detail":{}}`+"\n"), "", 0)
	f.Add([]byte("garbage\n\n{\"at\":2,\"tid\":\"t\",\"event\":\"x\"}"), "t", 1)
	f.Fuzz(func(t *testing.T, data []byte, tid string, limit int) {
		if limit < 0 || limit > 1000 {
			limit = 0
		}
		es, _, err := audit.ScanJSONL(context.Background(), bytes.NewReader(data), audit.Filter{TID: tid, Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 && len(es) > limit {
			t.Fatalf("%d entries over limit %d", len(es), limit)
		}
		for _, e := range es {
			if e.Event == "" || (tid != "" && e.TID != tid) {
				t.Fatalf("entry %+v does not match tid %q", e, tid)
			}
		}
	})
}
