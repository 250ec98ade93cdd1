package tokens_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lapd-dev/lapd/tokens"
)

func TestTabSecret(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		tok, tab, rec, err := f.m.MintTab(f.ctx, "", "https://app.example", "")
		if err != nil || len(tab) != 47 || tab[:4] != tokens.TabPrefix || rec.TabHash == "" {
			t.Fatalf("MintTab = %q %+v %v", tab, rec, err)
		}
		if stored, _ := f.m.Get(f.ctx, rec.TID); stored.TabHash == "" || stored.TabHash == tab {
			t.Fatalf("tab secret not stored hashed: %q", stored.TabHash)
		}
		other, _ := tokens.GenerateTabSecret()
		// The agent token alone, which the LLM side holds, no longer opens
		// the tab's socket; nor does another tab secret.
		for _, bad := range []string{"", other, "tab_short", tok} {
			if _, _, err := f.m.AcceptTab(f.ctx, tok, bad); !errors.Is(err, tokens.ErrTabSecret) {
				t.Errorf("AcceptTab with %q = %v, want ErrTabSecret", bad, err)
			}
		}
		if s := f.status(t, rec.TID); s != tokens.StatusAwaitingWS {
			t.Errorf("refused accepts moved the record to %s", s)
		}
		if got, _, err := f.m.AcceptTab(f.ctx, tok, tab); err != nil || got.TabHash == "" {
			t.Errorf("AcceptTab with the secret = %+v, %v", got, err)
		}
		// A session minted without one refuses a tab secret.
		tok2, _ := f.mint(t, "")
		if _, _, err := f.m.AcceptTab(f.ctx, tok2, tab); !errors.Is(err, tokens.ErrTabSecret) {
			t.Errorf("tab secret for a session without one = %v", err)
		}
	})
}

// Anonymous sessions were claimed and revoked by tid alone (uid "" matched
// everyone's): a stranger who read a tid in a log could lock the page out.
func TestAnonymousNeedsProof(t *testing.T) {
	t.Parallel()
	const origin = "https://app.example"
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		drop := func(tok, tab string, rec tokens.Record) {
			t.Helper()
			if _, _, err := f.m.AcceptTab(f.ctx, tok, tab); err != nil {
				t.Fatal(err)
			}
			if _, err := f.m.Disconnected(f.ctx, rec.TID); err != nil {
				t.Fatal(err)
			}
		}
		tok, tab, rec, _ := f.m.MintTab(f.ctx, "", origin, "")
		drop(tok, tab, rec)
		otherTab, _ := tokens.GenerateTabSecret()
		for name, by := range map[string]tokens.Owner{
			"tid alone":        {},
			"wrong tab secret": {TabSecret: otherTab},
			"agent token":      {Token: tok}, // the LLM side's: not enough to claim the tab's session
			"a uid":            {UID: "mallory", TabSecret: tab},
		} {
			if _, _, _, err := f.m.Claim(f.ctx, rec.TID, origin, by); !errors.Is(err, tokens.ErrForbidden) {
				t.Errorf("claim by %s = %v, want ErrForbidden", name, err)
			}
			if name == "agent token" {
				continue // the LLM side may end its own session: see TestRevokeWithAgentToken
			}
			if _, err := f.m.Revoke(f.ctx, rec.TID, by); !errors.Is(err, tokens.ErrForbidden) {
				t.Errorf("revoke by %s = %v, want ErrForbidden", name, err)
			}
		}
		if s := f.status(t, rec.TID); s != tokens.StatusPendingResume {
			t.Fatalf("refused claims moved the record to %s", s)
		}
		if _, _, _, err := f.m.Claim(f.ctx, rec.TID, "https://evil.example", tokens.Owner{TabSecret: tab}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("claim from another origin = %v", err)
		}
		newTok, newTab, got, err := f.m.Claim(f.ctx, rec.TID, origin, tokens.Owner{TabSecret: tab})
		if err != nil || newTok == tok || newTab == "" || newTab == tab || got.Status != tokens.StatusActive {
			t.Fatalf("claim with the tab secret = %q %q %+v %v", newTok, newTab, got, err)
		}
		if _, _, err := f.m.AcceptTab(f.ctx, newTok, tab); !errors.Is(err, tokens.ErrTabSecret) {
			t.Errorf("the old tab secret still opens the socket: %v", err)
		}
		if _, err := f.m.Revoke(f.ctx, rec.TID, tokens.Owner{TabSecret: newTab}); err != nil {
			t.Errorf("revoke with the tab secret: %v", err)
		}

		// A session minted without a tab secret (a reference client): its
		// agent token is the proof.
		tok2, rec2 := f.mint(t, "")
		drop(tok2, "", rec2)
		if _, _, _, err := f.m.Claim(f.ctx, rec2.TID, origin, tokens.Owner{}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("legacy claim by tid alone = %v", err)
		}
		newTok2, newTab2, _, err := f.m.Claim(f.ctx, rec2.TID, origin, tokens.Owner{Token: tok2})
		if err != nil || newTab2 != "" {
			t.Fatalf("legacy claim with the token = %q %v", newTab2, err)
		}
		if _, err := f.m.Revoke(f.ctx, rec2.TID, tokens.Owner{Token: tok2}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("revoke with the rotated-away token = %v", err)
		}
		if _, err := f.m.Revoke(f.ctx, rec2.TID, tokens.Owner{Token: newTok2}); err != nil {
			t.Errorf("revoke with the current token = %v", err)
		}
		// An identified session: the uid is proof enough.
		tok3, tab3, rec3, _ := f.m.MintTab(f.ctx, "alice", origin, "")
		drop(tok3, tab3, rec3)
		if _, _, _, err := f.m.Claim(f.ctx, rec3.TID, origin, tokens.Owner{UID: "alice"}); err != nil {
			t.Errorf("claim by the owner's uid: %v", err)
		}
		// The host app's admin revokes anything.
		_, rec4 := f.mint(t, "")
		if _, err := f.m.RevokeAny(f.ctx, rec4.TID); err != nil || f.status(t, rec4.TID) != tokens.StatusRevoked {
			t.Errorf("RevokeAny: %v", err)
		}
		if _, err := f.m.RevokeAny(f.ctx, "nope"); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("RevokeAny(unknown) = %v", err)
		}
	})
}

// After kill -9 nobody moved live records to pending-resume: the LLM heard
// "reconnect pending" until the token's TTL. AfterRestart gives them a fresh
// grace from start-up.
func TestAfterRestart(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{Grace: time.Minute}, func(t *testing.T, f *fixture) {
		_, active := f.paired(t, "")
		tok, awaiting := f.mint(t, "")
		f.m.Accept(f.ctx, tok) // awaiting-claude
		_, waitingWS := f.mint(t, "")
		_, pending := f.paired(t, "")
		f.m.Disconnected(f.ctx, pending.TID)
		pendingBefore, _ := f.m.Get(f.ctx, pending.TID)
		_, revoked := f.paired(t, "")
		f.m.RevokeAny(f.ctx, revoked.TID)

		f.clock.Advance(time.Hour) // the crash was a while ago
		n, err := f.m.AfterRestart(f.ctx)
		if err != nil || n != 2 {
			t.Fatalf("AfterRestart = %d, %v; want 2", n, err)
		}
		now := f.m.Now()
		for _, tid := range []string{active.TID, awaiting.TID} {
			rec, _ := f.m.Get(f.ctx, tid)
			if rec.Status != tokens.StatusPendingResume || rec.PendingResumeUntil != now+60_000 {
				t.Errorf("%s after restart: %s until %d, want pending-resume until %d", tid, rec.Status, rec.PendingResumeUntil, now+60_000)
			}
		}
		if s := f.status(t, waitingWS.TID); s != tokens.StatusAwaitingWS {
			t.Errorf("awaiting-ws moved to %s", s)
		}
		if rec, _ := f.m.Get(f.ctx, pending.TID); rec != pendingBefore {
			t.Errorf("pending-resume record changed: %+v", rec)
		}
		if s := f.status(t, revoked.TID); s != tokens.StatusRevoked {
			t.Errorf("revoked moved to %s", s)
		}
	})
}

// The agent token may revoke its own session (the LLM side ending it is no
// harm the LLM could not do by going quiet).
func TestRevokeWithAgentToken(t *testing.T) {
	t.Parallel()
	forEachStore(t, tokens.Config{}, func(t *testing.T, f *fixture) {
		tok, _, rec, _ := f.m.MintTab(f.ctx, "", "https://app.example", "")
		other, _, _, _ := f.m.MintTab(f.ctx, "", "https://app.example", "")
		if _, err := f.m.Revoke(f.ctx, rec.TID, tokens.Owner{Token: other}); !errors.Is(err, tokens.ErrForbidden) {
			t.Errorf("another session's token = %v", err)
		}
		if _, err := f.m.Revoke(f.ctx, rec.TID, tokens.Owner{Token: tok}); err != nil {
			t.Errorf("own token: %v", err)
		}
	})
}
