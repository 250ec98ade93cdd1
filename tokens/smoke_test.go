package tokens_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/lapd-dev/lapd/tokens"
)

func TestSmokeLifecycle(t *testing.T) {
	t.Parallel()
	sq, err := tokens.OpenSQLite(filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]tokens.Store{"memory": tokens.NewMemoryStore(), "sqlite": sq} {
		t.Run(name, func(t *testing.T) {
			defer st.Close()
			m, err := tokens.NewManager(tokens.Config{Store: st})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			tok, rec, err := m.Mint(ctx, "u1", "http://a", "")
			if err != nil || len(tok) != 47 || rec.Status != tokens.StatusAwaitingWS {
				t.Fatalf("mint %q %+v %v", tok, rec, err)
			}
			if rec, rep, err := m.Accept(ctx, tok); err != nil || rep || rec.Status != tokens.StatusAwaitingClaude {
				t.Fatalf("accept %+v %v %v", rec, rep, err)
			}
			if rec, ch, err := m.Activate(ctx, rec.TID); err != nil || !ch || rec.Label != "u1" {
				t.Fatalf("activate %+v %v %v", rec, ch, err)
			}
			if _, err := m.Disconnected(ctx, rec.TID); err != nil {
				t.Fatal(err)
			}
			tok2, rec2, err := m.Claim(ctx, rec.TID, "u1", "http://a")
			if err != nil || rec2.Status != tokens.StatusActive {
				t.Fatalf("claim %+v %v", rec2, err)
			}
			if _, err := m.Verify(ctx, tok); !errors.Is(err, tokens.ErrUnknown) {
				t.Fatalf("old token: %v", err)
			}
			if _, err := m.Revoke(ctx, rec.TID, "u1"); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Verify(ctx, tok2); !errors.Is(err, tokens.ErrRevoked) {
				t.Fatalf("revoked: %v", err)
			}
		})
	}
}
