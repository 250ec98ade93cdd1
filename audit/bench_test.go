package audit_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/lapd-dev/lapd/audit"
)

// BenchmarkSQLiteBatch: the cost per entry of the SQLite sink by batch size
// (one transaction per batch), with a lap-call entry's usual detail.
func BenchmarkSQLiteBatch(b *testing.B) {
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprint("batch=", n), func(b *testing.B) {
			db, err := audit.OpenSQLiteSink(filepath.Join(b.TempDir(), "lapd.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			l := audit.New(audit.Config{Sinks: []audit.Sink{db}, QueueSize: 1 << 20})
			defer l.Close()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += n {
				for j := range n {
					l.Record(b.Context(), audit.Entry{TID: "3f1c2a7e-0000-4000-8000-000000000000", Event: audit.EventLapCall,
						Detail: map[string]any{"tool": "observe", "i": i + j}})
				}
				if err := l.Flush(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
