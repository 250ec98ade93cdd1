package tokens_test

import (
	"fmt"
	"testing"

	"github.com/lapd-dev/lapd/tokens"
)

// benchManagers runs a sub-benchmark per store kind with a Manager over 1000
// minted records, passing it the token and tid of the last one.
func benchManagers(b *testing.B, run func(b *testing.B, m *tokens.Manager, token, tid string)) {
	for _, kind := range []string{"memory", "sqlite"} {
		b.Run(kind, func(b *testing.B) {
			var s tokens.Store = tokens.NewMemoryStore()
			if kind == "sqlite" {
				s = openSQLite(b)
			}
			defer s.Close()
			m, err := tokens.NewManager(tokens.Config{Store: s})
			if err != nil {
				b.Fatal(err)
			}
			var tok, tid string
			for i := range 1000 {
				t, rec, err := m.Mint(b.Context(), fmt.Sprint("user", i%10), "https://app.example", "")
				if err != nil {
					b.Fatal(err)
				}
				tok, tid = t, rec.TID
			}
			b.ReportAllocs()
			b.ResetTimer()
			run(b, m, tok, tid)
		})
	}
}

func BenchmarkVerify(b *testing.B) {
	benchManagers(b, func(b *testing.B, m *tokens.Manager, token, _ string) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := m.Verify(b.Context(), token); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

func BenchmarkTouch(b *testing.B) {
	benchManagers(b, func(b *testing.B, m *tokens.Manager, _, tid string) {
		for b.Loop() {
			if err := m.Touch(b.Context(), tid); err != nil {
				b.Fatal(err)
			}
		}
	})
}
