package tokens_test

import (
	"errors"
	"testing"

	"github.com/lapd-dev/lapd/tokens"
)

// FuzzHash feeds arbitrary bearer strings to Hash, the first check of every
// LAP call and WebSocket accept: it must accept exactly the 47-character
// agt_ base64url form and fail with ErrMalformed otherwise.
func FuzzHash(f *testing.F) {
	tok, _ := tokens.Generate()
	f.Add(tok)
	f.Add("agt_")
	f.Add("Bearer " + tok)
	f.Fuzz(func(t *testing.T, s string) {
		h, err := tokens.Hash(s)
		if err != nil {
			if !errors.Is(err, tokens.ErrMalformed) {
				t.Fatalf("Hash(%q) = %v, want ErrMalformed", s, err)
			}
			return
		}
		if len(s) != 47 || s[:4] != "agt_" || len(h) != 64 {
			t.Fatalf("Hash accepted %q", s)
		}
	})
}
